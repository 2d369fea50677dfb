package main

import (
	"math"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
)

func goodConfig() config {
	return config{
		abiMajor: abiMajor, dirs: []string{"/tmp/x"}, path: pathCPU, capacityBytes: 64 << 20,
		layers: 4, kvHeads: 2, headDim: 64, dtype: dtypeFP16, planes: 2, pageTokens: 16, chunkPages: 1,
		layout: layoutPerLayer, numPages: 64,
	}
}

func TestRuntimeConfig(t *testing.T) {
	rc, err := goodConfig().runtimeConfig()
	if err != nil {
		t.Fatal(err)
	}
	if rc.Path != runtime.PathCPU || rc.Layout != kvshape.LayoutPerLayer || rc.Geometry.DType != kvshape.FP16 || rc.NumPages != 64 {
		t.Fatalf("converted config %+v", rc)
	}
	g := goodConfig()
	g.gpuIOWindow, g.gpuMaxIOBytes, g.gpuLookahead = 384, 4<<20, 4
	if rc, err := g.runtimeConfig(); err != nil || rc.GPU.IOWindow != 384 || rc.GPU.MaxIOBytes != 4<<20 || rc.GPU.Lookahead != 4 {
		t.Fatalf("GPU reads: %+v %v", rc, err)
	}
	sw := goodConfig()
	sw.saveWritesPerDevice = 4
	if rc, err := sw.runtimeConfig(); err != nil || rc.SaveWritesPerDevice != 4 {
		t.Fatalf("save writes per device: %+v %v", rc, err)
	}
	g.gpuFlags = gpuReadsFromDevices // the runtime's default: accepted, explicit values still win
	if rc, err := g.runtimeConfig(); err != nil || rc.GPU.IOWindow != 384 {
		t.Fatalf("TUTTI_GPU_READS_FROM_DEVICES: %+v %v", rc, err)
	}
	cases := []struct {
		name   string
		change func(*config)
		want   status
		frag   string
	}{
		{"abi major", func(c *config) { c.abiMajor = 2 }, errVersion, "abi_major = 2"},
		{"tp rank without tp", func(c *config) { c.tpRank = 1 }, errInvalidArgument, "tp_rank = 1"},
		{"tp rank past size", func(c *config) { c.tpSize, c.tpRank = 2, 2 }, errInvalidArgument, "tp_rank = 2"},
		{"tp size huge", func(c *config) { c.tpSize = 65 }, errInvalidArgument, "tp_size = 65"},
		{"tp heads not divisible", func(c *config) { c.tpSize = 3 }, errGeometry, "cannot be split evenly over 3 ranks"},
		{"path", func(c *config) { c.path = 0 }, errInvalidArgument, "path = 0"},
		{"dtype", func(c *config) { c.dtype = 5 }, errInvalidArgument, "dtype = 5"},
		{"layout", func(c *config) { c.layout = 3 }, errInvalidArgument, "layout = 3"},
		{"num pages zero", func(c *config) { c.numPages = 0 }, errInvalidArgument, "num_pages"},
		{"num pages huge", func(c *config) { c.numPages = math.MaxInt32 + 1 }, errInvalidArgument, "num_pages"},
		{"planes", func(c *config) { c.planes = 3 }, errGeometry, "Planes"},
		{"layers", func(c *config) { c.layers = -1 }, errGeometry, "Layers"},
		{"capacity", func(c *config) { c.capacityBytes = 0 }, errInvalidArgument, "CapacityBytes"},
		{"queue depth", func(c *config) { c.queueDepth = -5 }, errInvalidArgument, "QueueDepth"},
		{"save writes negative", func(c *config) { c.saveWritesPerDevice = -1 }, errInvalidArgument, "SaveWritesPerDevice"},
		{"save writes huge", func(c *config) { c.saveWritesPerDevice = 257 }, errInvalidArgument, "SaveWritesPerDevice"},
		{"reserved3", func(c *config) { c.reserved3 = 1 }, errInvalidArgument, "reserved3 = 1"},
		{"dup dirs", func(c *config) { c.dirs = []string{"/a", "/a"} }, errInvalidArgument, "twice"},
		{"unknown gpu flag", func(c *config) { c.gpuFlags = 2 }, errInvalidArgument, "gpu_flags = 0x2"},
		{"unknown gpu flag with a known one", func(c *config) { c.gpuFlags = 1 | 1<<31 }, errInvalidArgument, "(0x80000000); known: TUTTI_GPU_READS_FROM_DEVICES = 1"},
		{"gpu max io", func(c *config) { c.gpuMaxIOBytes = 4097 }, errInvalidArgument, "GPU.MaxIOBytes"},
		{"gpu window", func(c *config) { c.gpuIOWindow = -1 }, errInvalidArgument, "GPU.IOWindow"},
		{"gpu lookahead", func(c *config) { c.gpuLookahead = 17 }, errInvalidArgument, "GPU.Lookahead"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := goodConfig()
			c.change(&cfg)
			_, err := cfg.runtimeConfig()
			if got := classify(err); got != c.want {
				t.Fatalf("status %v (%v), want %v", got, err, c.want)
			}
			if !strings.Contains(err.Error(), c.frag) {
				t.Fatalf("error %q does not name %q", err, c.frag)
			}
		})
	}
}

func TestKVMemory(t *testing.T) {
	rc, err := goodConfig().runtimeConfig()
	if err != nil {
		t.Fatal(err)
	}
	need := uint64(64 * rc.Geometry.PageBytesPerLayer())
	good := func() []region {
		rs := make([]region, 4)
		for i := range rs {
			rs[i] = region{addr: 0x10000 * uint64(i+1), lenBytes: need}
		}
		return rs
	}
	kv, err := kvMemory(rc, memoryHost, good())
	if err != nil || len(kv.Layers) != 4 || kv.Layers[3].LenBytes != int64(need) {
		t.Fatalf("kvMemory: %+v %v", kv, err)
	}
	cases := []struct {
		name   string
		memory uint32
		change func([]region) []region
		want   status
		frag   string
	}{
		{"cuda on cpu path", memoryCUDA, nil, errInvalidArgument, "CPU path"},
		{"bad memory", 9, nil, errInvalidArgument, "memory = 9"},
		{"count", memoryHost, func(r []region) []region { return r[:3] }, errGeometry, "num_regions = 3"},
		{"length", memoryHost, func(r []region) []region { r[1].lenBytes++; return r }, errGeometry, "regions[1].len_bytes"},
		{"null", memoryHost, func(r []region) []region { r[2].addr = 0; return r }, errInvalidArgument, "regions[2].addr is NULL"},
		{"align", memoryHost, func(r []region) []region { r[0].addr += 8; return r }, errInvalidArgument, "aligned"},
		{"overflow", memoryHost, func(r []region) []region { r[3].addr = math.MaxUint64 - 15; return r }, errInvalidArgument, "overflow"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rs := good()
			if c.change != nil {
				rs = c.change(rs)
			}
			_, err := kvMemory(rc, c.memory, rs)
			if got := classify(err); got != c.want || !strings.Contains(err.Error(), c.frag) {
				t.Fatalf("got %v (%v), want %v naming %q", got, err, c.want, c.frag)
			}
		})
	}
}

func TestCheckPages(t *testing.T) {
	cfg := goodConfig()
	cfg.chunkPages = 2
	rc, err := cfg.runtimeConfig()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		chain    int
		pages    []int32
		distinct bool
		want     status
	}{
		{"ok", 2, []int32{0, 1, 2, 3}, true, statusOK},
		{"count", 2, []int32{0, 1, 2}, false, errGeometry},
		{"negative", 1, []int32{0, -1}, false, errOutOfRange},
		{"too big", 1, []int32{64, 0}, false, errOutOfRange},
		{"dup load", 1, []int32{5, 5}, true, errInvalidArgument},
		{"dup save ok", 1, []int32{5, 5}, false, statusOK},
	} {
		if got := classify(checkPages(rc, c.chain, c.pages, c.distinct)); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// FuzzConfig feeds arbitrary field values through the conversion: it must
// never panic, and it either succeeds with a config runtime accepts or fails
// with a caller-error status (never TUTTI_ERR_INTERNAL).
func FuzzConfig(f *testing.F) {
	f.Add(uint32(1), uint32(1), int64(64<<20), int32(4), int32(2), int32(64), uint32(2), int32(2), int32(16), int32(1), uint32(1), int64(64), int32(0), int64(0), int64(0))
	f.Add(uint32(1), uint32(2), int64(1), int32(61), int32(1), int32(576), uint32(1), int32(1), int32(64), int32(8), uint32(2), int64(1<<20), int32(4096), int64(1<<30), int64(1<<20))
	f.Fuzz(func(t *testing.T, major, path uint32, capacity int64, layers, heads, dim int32, dtype uint32, planes, pageTokens, chunkPages int32, layout uint32, numPages int64, depth int32, staging, slot int64) {
		c := config{abiMajor: major, dirs: []string{"/d"}, path: path, capacityBytes: capacity,
			layers: layers, kvHeads: heads, headDim: dim, dtype: dtype, planes: planes, pageTokens: pageTokens,
			chunkPages: chunkPages, layout: layout, numPages: numPages, queueDepth: depth,
			stagingBytes: staging, stagingSlotBytes: slot}
		rc, err := c.runtimeConfig()
		if err != nil {
			switch classify(err) {
			case errVersion, errInvalidArgument, errGeometry:
			default:
				t.Fatalf("status %v for a bad config: %v", classify(err), err)
			}
			return
		}
		if err := rc.Validate(); err != nil {
			t.Fatalf("accepted a config runtime refuses: %v", err)
		}
		if _, err := rc.Geometry.TensorBytes(rc.Layout, rc.NumPages); err != nil {
			t.Fatalf("accepted config has no tensor size: %v", err)
		}
	})
}
