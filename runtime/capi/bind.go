package main

import (
	"math"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
	"github.com/tutti-io/tutti/sched"
)

// ABI version of this library (TUTTI_ABI_MAJOR/MINOR in tutti.h).
const (
	abiMajor = 1
	abiMinor = 10
)

// Values of the enums in tutti.h (TestHeaderEnums keeps them equal).
const (
	pathCPU = 1
	pathGPU = 2

	dtypeBF16 = 1
	dtypeFP16 = 2
	dtypeFP8  = 3
	dtypeFP32 = 4

	layoutPerLayer   = 1
	layoutCrossLayer = 2

	memoryHost = 1
	memoryCUDA = 2

	gpuReadsFromDevices = 1 // TUTTI_GPU_READS_FROM_DEVICES
	gpuFlagsKnown       = gpuReadsFromDevices
)

// Limits on what one call may pass, so a garbage count fails as an argument
// error instead of an enormous allocation.
const (
	maxDirs        = 64
	maxPathBytes   = 4096
	maxChainBlocks = 1 << 20
	maxPagesPerOp  = 1 << 24
	// regionAlign is the alignment of every registered KV region: the GPU
	// scatter and gather kernels move 16-byte vectors, and the same rule on
	// the CPU path keeps a buffer valid for both.
	regionAlign = 16
)

// config is tutti_config in Go types, read from C memory by exports.go.
type config struct {
	abiMajor                       uint32
	dirs                           []string
	path                           uint32
	capacityBytes                  int64
	layers, kvHeads, headDim       int32
	dtype                          uint32
	planes, pageTokens, chunkPages int32
	layout                         uint32
	numPages                       int64
	queueDepth, saveBoundMs        int32
	stagingBytes, stagingSlotBytes int64
	maxLoads                       int32
	tpRank                         uint32     // ABI 1.2 (reserved before: 0)
	compute                        [3]float64 // fixed, per token, per pair (ns)
	device                         [7]float64 // sched.DeviceProfile in field order
	saveBudgetBytes                int64
	gpuDevice, gpuMaxPages         int32
	gpuMaxRuns                     int32
	tpSize                         uint32 // ABI 1.2 (reserved2 before: 0)
	// ABI 1.1 (zero from a 1.0 caller)
	gpuIOWindow, gpuMaxIOBytes, gpuLookahead int32
	gpuFlags                                 uint32
	saveWritesPerDevice                      int32 // ABI 1.3
	reserved3                                uint32
}

// runtimeConfig checks what the runtime cannot see (ABI version, enum
// values of this ABI) and converts; runtime.Config.Validate checks the rest
// at Open and names the bad field.
func (c config) runtimeConfig() (runtime.Config, error) {
	var rc runtime.Config
	if c.abiMajor != abiMajor {
		return rc, errorf(errVersion, "tutti_config.abi_major = %d, this library is ABI %d.%d", c.abiMajor, abiMajor, abiMinor)
	}
	if err := c.checkTP(); err != nil {
		return rc, err
	}
	if c.reserved3 != 0 {
		return rc, errorf(errInvalidArgument, "tutti_config.reserved3 = %d, want 0", c.reserved3)
	}
	if u := c.gpuFlags &^ gpuFlagsKnown; u != 0 {
		return rc, errorf(errInvalidArgument, "tutti_config.gpu_flags = %#x has bits unknown to ABI %d.%d (%#x); known: TUTTI_GPU_READS_FROM_DEVICES = %d",
			c.gpuFlags, abiMajor, abiMinor, u, gpuReadsFromDevices)
	}
	// GPU reads sized to the devices are the runtime's default for every
	// zero GPU field (runtime.GPUConfig): TUTTI_GPU_READS_FROM_DEVICES is
	// accepted for ABI compatibility and asks for what is done anyway.
	switch c.path {
	case pathCPU:
		rc.Path = runtime.PathCPU
	case pathGPU:
		rc.Path = runtime.PathGPU
	default:
		return rc, errorf(errInvalidArgument, "tutti_config.path = %d, want TUTTI_PATH_CPU (1) or TUTTI_PATH_GPU (2)", c.path)
	}
	dt, err := dtypeFromABI(c.dtype)
	if err != nil {
		return rc, err
	}
	switch c.layout {
	case layoutPerLayer:
		rc.Layout = kvshape.LayoutPerLayer
	case layoutCrossLayer:
		rc.Layout = kvshape.LayoutCrossLayer
	default:
		return rc, errorf(errInvalidArgument, "tutti_config.layout = %d, want TUTTI_LAYOUT_PER_LAYER (1) or TUTTI_LAYOUT_CROSS_LAYER (2)", c.layout)
	}
	if c.numPages <= 0 || c.numPages > math.MaxInt32 {
		return rc, errorf(errInvalidArgument, "tutti_config.num_pages = %d, want 1..%d", c.numPages, math.MaxInt32)
	}
	rc.Dirs = c.dirs
	rc.CapacityBytes = c.capacityBytes
	rc.Geometry = kvshape.Geometry{
		Layers: int(c.layers), KVHeads: int(c.kvHeads), HeadDim: int(c.headDim), DType: dt,
		Planes: int(c.planes), PageTokens: int(c.pageTokens), ChunkPages: int(c.chunkPages),
	}
	if err := rc.Geometry.Validate(); err != nil {
		return rc, &abiError{code: errGeometry, msg: "tutti_config", err: err}
	}
	if rc.Geometry, err = c.shardGeometry(rc.Geometry); err != nil {
		return rc, err
	}
	rc.NumPages = int(c.numPages)
	rc.QueueDepth = int(c.queueDepth)
	rc.SaveBoundMs = int(c.saveBoundMs)
	rc.StagingBytes = c.stagingBytes
	rc.StagingSlotBytes = c.stagingSlotBytes
	rc.MaxLoads = int(c.maxLoads)
	rc.SaveWritesPerDevice = int(c.saveWritesPerDevice)
	rc.SaveBudgetBytes = c.saveBudgetBytes
	rc.GPU.Device, rc.GPU.MaxPages, rc.GPU.MaxRuns = int(c.gpuDevice), int(c.gpuMaxPages), int(c.gpuMaxRuns)
	rc.GPU.IOWindow, rc.GPU.MaxIOBytes, rc.GPU.Lookahead = int(c.gpuIOWindow), int(c.gpuMaxIOBytes), int(c.gpuLookahead)
	rc.Compute = sched.ComputeModel{FixedNs: c.compute[0], PerTokenNs: c.compute[1], PerPairNs: c.compute[2]}
	d := c.device
	rc.Device = sched.DeviceProfile{ReadBytesPerSec: d[0], WriteBytesPerSec: d[1], ReadIOPS: d[2], WriteIOPS: d[3],
		ReadLatencyNs: d[4], ReadShareUnderWrites: d[5], WriteShareUnderReads: d[6]}
	if rc.Device != (sched.DeviceProfile{}) {
		if err := rc.Device.Validate(); err != nil {
			return rc, &abiError{code: errInvalidArgument, msg: "tutti_config.device_*", err: err}
		}
	}
	if err := rc.Validate(); err != nil {
		return rc, &abiError{code: errInvalidArgument, msg: "tutti_config", err: err}
	}
	return rc, nil
}

func dtypeFromABI(d uint32) (kvshape.DType, error) {
	switch d {
	case dtypeBF16:
		return kvshape.BF16, nil
	case dtypeFP16:
		return kvshape.FP16, nil
	case dtypeFP8:
		return kvshape.FP8, nil
	case dtypeFP32:
		return kvshape.FP32, nil
	}
	return kvshape.DTypeInvalid, errorf(errInvalidArgument, "tutti_config.dtype = %d, want TUTTI_DTYPE_BF16 (1), FP16 (2), FP8 (3) or FP32 (4)", d)
}

// region is tutti_kv_region.
type region struct{ addr, lenBytes uint64 }

// kvMemory checks regions against the store's geometry and layout and the
// memory kind against its path, and builds the runtime's description.
// Lengths must be exact: a tensor of another shape is a caller bug that a
// longer-or-equal rule would let through.
func kvMemory(cfg runtime.Config, memory uint32, regions []region) (runtime.KVMemory, error) {
	var kv runtime.KVMemory
	switch memory {
	case memoryHost:
		if cfg.Path != runtime.PathCPU {
			return kv, errorf(errInvalidArgument, "memory = TUTTI_MEMORY_HOST but the store uses the GPU path (register CUDA device memory)")
		}
	case memoryCUDA:
		if cfg.Path != runtime.PathGPU {
			return kv, errorf(errInvalidArgument, "memory = TUTTI_MEMORY_CUDA but the store uses the CPU path (register host memory)")
		}
	default:
		return kv, errorf(errInvalidArgument, "memory = %d, want TUTTI_MEMORY_HOST (1) or TUTTI_MEMORY_CUDA (2)", memory)
	}
	g := cfg.Geometry
	want := g.Layers
	what := "one per layer (TUTTI_LAYOUT_PER_LAYER)"
	if cfg.Layout == kvshape.LayoutCrossLayer {
		want, what = 1, "one for the cross-layer cache (TUTTI_LAYOUT_CROSS_LAYER)"
	}
	if len(regions) != want {
		return kv, errorf(errGeometry, "num_regions = %d, want %d: %s", len(regions), want, what)
	}
	need, err := g.TensorBytes(cfg.Layout, cfg.NumPages)
	if err != nil {
		return kv, &abiError{code: errGeometry, msg: "register_kv", err: err}
	}
	for i, r := range regions {
		if r.addr == 0 {
			return kv, errorf(errInvalidArgument, "regions[%d].addr is NULL", i)
		}
		if r.addr%regionAlign != 0 {
			return kv, errorf(errInvalidArgument, "regions[%d].addr = %#x is not %d-byte aligned", i, r.addr, regionAlign)
		}
		if r.lenBytes != uint64(need) {
			return kv, errorf(errGeometry, "regions[%d].len_bytes = %d, the geometry (%v, %s, %d pages) needs exactly %d",
				i, r.lenBytes, g, cfg.Layout, cfg.NumPages, need)
		}
		if r.addr+r.lenBytes < r.addr || r.addr+r.lenBytes > math.MaxInt64 {
			return kv, errorf(errInvalidArgument, "regions[%d]: %#x + %d bytes overflows the address space", i, r.addr, r.lenBytes)
		}
		rg := runtime.Region{Addr: uintptr(r.addr), LenBytes: int64(r.lenBytes)}
		if cfg.Layout == kvshape.LayoutCrossLayer {
			kv.Cross = rg
		} else {
			kv.Layers = append(kv.Layers, rg)
		}
	}
	return kv, nil
}

// checkPages checks a (chain, pages) pair of a load or save: chunkPages page
// ids per chain block, each in [0, numPages). Loads write the pages, so they
// must also be distinct (two blocks landing in one page is a block-table bug).
func checkPages(cfg runtime.Config, chainLen int, pages []int32, distinct bool) error {
	cp := cfg.Geometry.ChunkPages
	if len(pages) != chainLen*cp {
		return errorf(errGeometry, "num_pages = %d, want chain_len (%d) * chunk_pages (%d) = %d", len(pages), chainLen, cp, chainLen*cp)
	}
	var seen map[int32]int
	if distinct {
		seen = make(map[int32]int, len(pages))
	}
	for i, p := range pages {
		if p < 0 || int(p) >= cfg.NumPages {
			return errorf(errOutOfRange, "pages[%d] = %d, want 0..%d (num_pages = %d)", i, p, cfg.NumPages-1, cfg.NumPages)
		}
		if distinct {
			if j, dup := seen[p]; dup {
				return errorf(errInvalidArgument, "pages[%d] = pages[%d] = %d: a load must restore into distinct pages", i, j, p)
			}
			seen[p] = i
		}
	}
	return nil
}

// countArg checks an element count received from C.
func countArg(name string, n uint64, limit uint64) error {
	if n == 0 {
		return errorf(errInvalidArgument, "%s = 0", name)
	}
	if n > limit {
		return errorf(errInvalidArgument, "%s = %d exceeds the limit %d", name, n, limit)
	}
	return nil
}
