// Package devbench measures a storage device the way every later tutti
// benchmark divides by: O_DIRECT reads (and writes when asked) over a grid of
// block sizes and queue depths, through io_uring (plain and SQPOLL) and
// through pread(2) from N goroutines. It backs `tutti devbench`, and Ceiling
// gives other benchmarks the device's ceiling measured in their own run;
// CeilingStriped that of several devices reading data striped over them.
package devbench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Engines and ops devbench knows.
var (
	Engines = []string{"uring", "uring-sqpoll", "pread"}
	Ops     = []string{"randread", "seqread", "randwrite", "seqwrite"}
)

// Row is one measured point. The JSON field names are part of the CLI's
// contract. For pread, QueueDepth is the number of goroutines.
type Row struct {
	Engine     string  `json:"engine"`
	Op         string  `json:"op"`
	BlockBytes int     `json:"block_bytes"`
	QueueDepth int     `json:"queue_depth"`
	IOPS       float64 `json:"iops"`
	BytesPerS  float64 `json:"bytes_per_s"`
	P50Us      float64 `json:"p50_us"`
	P99Us      float64 `json:"p99_us"`
	CPUSPerGiB float64 `json:"cpu_s_per_gib"` // process CPU (getrusage RUSAGE_SELF, which includes the iou-sqp thread on Linux 6.18) per GiB moved
	// BufferBytes is the memory the I/Os rotated over (uring engines) and
	// BufferHuge whether it was all on huge pages at the end (with 4 KiB
	// pages a 1 MiB I/O has 256 segments, which many devices split).
	BufferBytes int64 `json:"buffer_bytes,omitempty"`
	BufferHuge  bool  `json:"buffer_huge,omitempty"`

	Ops        int64   `json:"-"` // I/Os completed
	Bytes      int64   `json:"-"` // bytes they moved (every I/O is whole: Ops × BlockBytes)
	Seconds    float64 `json:"-"` // wall time of the row
	CPUSeconds float64 `json:"-"` // process CPU during the row
	SQPollCPUS float64 `json:"-"` // of which the SQPOLL thread (uring-sqpoll only)
}

// Config of a run. Zero fields take the defaults of DefaultConfig.
type Config struct {
	Path        string   // file, directory (a test file is created in it), or block device
	BlockSizes  []int    // bytes; multiples of the device's O_DIRECT alignment
	QueueDepths []int    // 1..4096
	Engines     []string // of Engines
	Ops         []string // of Ops
	Runtime     time.Duration
	SizeBytes   int64 // test file size (ignored for a block device: its size is used)
	Keep        bool  // keep a test file this run created
	Seed        uint64
	// BufferBytes is the memory the uring engines' I/Os rotate over
	// (reads land in it, writes come from it); 0: one block per I/O in
	// flight (depth × block size). A larger one models a restore, which
	// writes GiBs into its staging: 32 × 1 MiB of destination fits in a
	// large last-level cache, and on RAM-backed loop devices (where a read
	// is a memcpy by the loop's kernel thread) a cache-resident destination
	// can read faster than a restore's would, so a ceiling for a restore
	// reads into a destination of the restore's size (BENCHMARKS.md, What
	// the defaults rest on). When it
	// is not larger than the depth, two I/Os in flight may share a block of
	// it (a read benchmark never looks at the data). At most 1 GiB; the
	// pread engine ignores it.
	BufferBytes int64
	// AllowHoles reads a loop device whose backing file has holes in the
	// measured range (checkWritten refuses it otherwise): a read of a hole
	// never reaches the medium, so this measures something else on purpose.
	AllowHoles bool
	// Progress, if set, is called before each row (row == nil) and after it.
	Progress func(done, total int, spec Spec, row *Row)
}

// Spec names one grid point.
type Spec struct {
	Engine     string
	Op         string
	BlockBytes int
	QueueDepth int
}

func (s Spec) String() string {
	return fmt.Sprintf("%s %s %s qd%d", s.Engine, s.Op, FormatBytes(int64(s.BlockBytes)), s.QueueDepth)
}

// DefaultConfig is the full grid: 4 KiB..4 MiB, queue depth 1..256, the
// three engines, random and sequential reads, 1 s a row, a 1 GiB file.
func DefaultConfig() Config {
	return Config{
		BlockSizes:  []int{4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20},
		QueueDepths: []int{1, 4, 16, 64, 256},
		Engines:     []string{"uring", "uring-sqpoll", "pread"},
		Ops:         []string{"randread", "seqread"},
		Runtime:     time.Second,
		SizeBytes:   1 << 30,
		Seed:        1,
	}
}

// maxBufferBytes bounds the I/O memory of one row (block size × depth).
const maxBufferBytes = 1 << 30

func (c *Config) fill() {
	d := DefaultConfig()
	if len(c.BlockSizes) == 0 {
		c.BlockSizes = d.BlockSizes
	}
	if len(c.QueueDepths) == 0 {
		c.QueueDepths = d.QueueDepths
	}
	if len(c.Engines) == 0 {
		c.Engines = d.Engines
	}
	if len(c.Ops) == 0 {
		c.Ops = d.Ops
	}
	if c.Runtime == 0 {
		c.Runtime = d.Runtime
	}
	if c.SizeBytes == 0 {
		c.SizeBytes = d.SizeBytes
	}
}

// Validate reports the first bad setting in words a user can act on.
func (c *Config) Validate() error {
	if c.Path == "" {
		return errors.New("no path: give a file, directory or block device")
	}
	for _, e := range c.Engines {
		if !contains(Engines, e) {
			return fmt.Errorf("unknown engine %q (want %s)", e, strings.Join(Engines, ", "))
		}
	}
	for _, o := range c.Ops {
		if !contains(Ops, o) {
			return fmt.Errorf("unknown op %q (want %s)", o, strings.Join(Ops, ", "))
		}
	}
	for _, bs := range c.BlockSizes {
		if bs < 512 || bs%512 != 0 || bs > 64<<20 {
			return fmt.Errorf("block size %d: must be a multiple of 512 between 512 B and 64 MiB", bs)
		}
	}
	for _, qd := range c.QueueDepths {
		if qd < 1 || qd > 4096 {
			return fmt.Errorf("queue depth %d: must be in 1..4096", qd)
		}
	}
	if c.Runtime <= 0 || c.Runtime > time.Hour {
		return fmt.Errorf("runtime %v: must be in (0, 1h]", c.Runtime)
	}
	if c.SizeBytes < 1<<20 {
		return fmt.Errorf("size %d: must be at least 1 MiB", c.SizeBytes)
	}
	if c.BufferBytes < 0 || c.BufferBytes > maxBufferBytes {
		return fmt.Errorf("buffer %d bytes: must be in [0, %d] (0: depth × block size)", c.BufferBytes, int64(maxBufferBytes))
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Run measures every grid point (engines × ops × block sizes × queue depths,
// in that nesting) and returns one Row each. The test target is prepared
// first (a file is written with real data) and removed at the end unless
// Keep. A grid point whose buffers would exceed 1 GiB is skipped (reported
// through Progress with a nil row and listed in the error-free result as
// absent). ctx cancels between and within rows.
func Run(ctx context.Context, cfg Config) ([]Row, error) {
	cfg.fill()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	writes := slices.ContainsFunc(cfg.Ops, isWrite)
	t, err := openTarget(ctx, cfg.Path, cfg.SizeBytes, writes, cfg.Keep, cfg.Seed)
	if err != nil {
		return nil, err
	}
	defer t.close()
	if err := t.checkReads(cfg.BlockSizes, writes || cfg.AllowHoles); err != nil {
		return nil, err
	}
	var specs []Spec
	for _, e := range cfg.Engines {
		for _, o := range cfg.Ops {
			for _, bs := range cfg.BlockSizes {
				for _, qd := range cfg.QueueDepths {
					if int64(bs)*int64(qd) > maxBufferBytes {
						continue
					}
					specs = append(specs, Spec{Engine: e, Op: o, BlockBytes: bs, QueueDepth: qd})
				}
			}
		}
	}
	rows := make([]Row, 0, len(specs))
	for i, s := range specs {
		if err := ctx.Err(); err != nil {
			return rows, err
		}
		if cfg.Progress != nil {
			cfg.Progress(i, len(specs), s, nil)
		}
		row, err := measure(ctx, t, s, cfg.Runtime, cfg.Seed+uint64(i), uringRun{bufferBytes: cfg.BufferBytes})
		if err != nil {
			return rows, fmt.Errorf("%s: %w", s, err)
		}
		rows = append(rows, row)
		if cfg.Progress != nil {
			cfg.Progress(i+1, len(specs), s, &row)
		}
	}
	return rows, nil
}

// Ceiling measures the device's read ceiling in the caller's own run: 1 MiB
// O_DIRECT random reads at queue depth 32 through the uring engine for 2 s
// over a test file of sizeBytes (created in path if path is a directory or
// does not exist, and removed afterwards; an existing file or block device is
// read within its first sizeBytes, which must be written: see ceilingOn). It
// returns bytes/s and the row.
func Ceiling(ctx context.Context, path string, sizeBytes int64) (float64, Row, error) {
	return CeilingInto(ctx, path, sizeBytes, 0)
}

// CeilingInto is Ceiling with its reads rotating over bufferBytes of
// destination (Config.BufferBytes; 0: 32 MiB, one block per read in
// flight).
func CeilingInto(ctx context.Context, path string, sizeBytes, bufferBytes int64) (float64, Row, error) {
	row, err := ceilingOn(ctx, path, sizeBytes, ceilingRuntime, ceilingSpec, uringRun{bufferBytes: bufferBytes})
	if err != nil {
		return 0, Row{}, fmt.Errorf("measuring the device ceiling of %s: %w", path, err)
	}
	return row.BytesPerS, row, nil
}

// isWrite says whether op (of Ops) writes its target.
func isWrite(op string) bool { return strings.HasSuffix(op, "write") }

// The ceiling's grid point and time bound.
var ceilingSpec = Spec{Engine: "uring", Op: "randread", BlockBytes: 1 << 20, QueueDepth: 32}

// ceilingWriteSpec is the write ceilings' grid point: ceilingSpec's
// size and depth, sequential (a save writes whole objects).
var ceilingWriteSpec = Spec{Engine: "uring", Op: "seqwrite", BlockBytes: 1 << 20, QueueDepth: 32}

const ceilingRuntime = 2 * time.Second

// ceilingOn opens path as Run does (a directory gets a test file of
// sizeBytes, removed afterwards) and measures spec (ceilingSpec, or
// ceilingWriteSpec: then the target's blocks are overwritten) for at most
// dur, with every I/O within the first sizeBytes of the target.
func ceilingOn(ctx context.Context, path string, sizeBytes int64, dur time.Duration, spec Spec, o uringRun) (Row, error) {
	cfg := Config{Path: path, BlockSizes: []int{spec.BlockBytes}, QueueDepths: []int{spec.QueueDepth},
		Engines: []string{spec.Engine}, Ops: []string{spec.Op}, Runtime: dur, SizeBytes: sizeBytes,
		Seed: 1, BufferBytes: o.bufferBytes}
	if err := cfg.Validate(); err != nil {
		return Row{}, err
	}
	t, err := openCeilingTarget(ctx, path, sizeBytes, isWrite(spec.Op))
	if err != nil {
		return Row{}, err
	}
	defer t.close()
	return measure(ctx, t, spec, dur, 1, o)
}

// openCeilingTarget is openTarget with the reads kept within the first
// sizeBytes of a block device too (Run reads a block device whole). A
// ceiling is taken over data a benchmark wrote, and a device larger than
// that data holds unwritten blocks whose reads cost another amount: on a
// loop device over a sparse file in /dev/shm a read of a hole is a memset,
// several times faster than a read of data, and a benchmark's loop devices need not be full of its data.
func openCeilingTarget(ctx context.Context, path string, sizeBytes int64, writes bool) (*target, error) {
	t, err := openTarget(ctx, path, sizeBytes, writes, false, 1)
	if err != nil {
		return nil, err
	}
	if limit := sizeBytes / (1 << 20) * (1 << 20); limit > 0 && limit < t.sizeBytes {
		t.sizeBytes = limit
	}
	if err := t.checkReads([]int{ceilingSpec.BlockBytes}, false); err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

// WriteCeilingFile writes a new file of sizeBytes (rounded up to whole MiB)
// of pseudo-random data with O_DIRECT and fsyncs it: what the ceilings
// write for a path that does not exist, kept, so that several measurements
// over one directory (CeilingEachInto, then CeilingStriped) read the same
// data and write it once. The caller removes it. An existing path is an
// error.
func WriteCeilingFile(ctx context.Context, path string, sizeBytes int64) error {
	t, err := createTarget(ctx, path, wholeMiB(sizeBytes), true, 1)
	if err != nil {
		return err
	}
	return t.close()
}

// CeilingEachInto measures the Ceiling of every path at the same time
// (striped storage: the aggregate the devices deliver together, which their
// separate ceilings overstate when they share CPUs or a bus), path i's reads
// within sizeBytes[i] and every path's reads rotating over bufferBytes
// (CeilingInto; 0: devbench's own 32 MiB). Every device's clock starts once
// all of them are set up (their buffers allocated and registered), so that
// none runs part of its 2 s alone. rows[i] and errs[i] are path i's.
func CeilingEachInto(ctx context.Context, paths []string, sizeBytes []int64, bufferBytes int64) (rows []Row, errs []error) {
	return together(len(paths), func(i int, ready func()) (Row, error) {
		row, err := ceilingOn(ctx, paths[i], sizeBytes[i], ceilingRuntime, ceilingSpec, uringRun{bufferBytes: bufferBytes, ready: ready})
		if err != nil {
			return Row{}, fmt.Errorf("measuring the device ceiling of %s: %w", paths[i], err)
		}
		return row, nil
	})
}

// result is what an engine loop returns.
type result struct {
	ops, bytes  int64
	lat         hist
	elapsed     time.Duration
	sqpollCPU   time.Duration
	bufferBytes int64 // uring engines: the I/O memory and whether it was huge
	bufferHuge  bool
}

// measure runs one grid point; o carries Config.BufferBytes and, for the
// ceilings, a byte budget and a start barrier (uringRun; the pread engine
// takes none of them).
func measure(ctx context.Context, t *target, s Spec, runtime time.Duration, seed uint64, o uringRun) (Row, error) {
	cpu0 := processCPU()
	var res *result
	var err error
	switch s.Engine {
	case "uring", "uring-sqpoll":
		res, err = runUring(ctx, t, s, runtime, seed, o)
	case "pread":
		res, err = runPread(ctx, t, s, runtime, seed)
	}
	if err != nil {
		return Row{}, err
	}
	cpu := processCPU() - cpu0
	secs := res.elapsed.Seconds()
	row := Row{
		Engine: s.Engine, Op: s.Op, BlockBytes: s.BlockBytes, QueueDepth: s.QueueDepth,
		IOPS: float64(res.ops) / secs, BytesPerS: float64(res.bytes) / secs,
		P50Us: res.lat.quantile(0.50) / 1e3, P99Us: res.lat.quantile(0.99) / 1e3,
		Ops: res.ops, Bytes: res.bytes, Seconds: secs, CPUSeconds: cpu.Seconds(), SQPollCPUS: res.sqpollCPU.Seconds(),
		BufferBytes: res.bufferBytes, BufferHuge: res.bufferHuge,
	}
	if res.bytes > 0 {
		row.CPUSPerGiB = cpu.Seconds() / (float64(res.bytes) / (1 << 30))
	}
	if math.IsNaN(row.P50Us) {
		row.P50Us, row.P99Us = 0, 0
	}
	return row, nil
}

func processCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// offsets generates block offsets: uniform random, or one sequential cursor
// shared by all in-flight I/O (wrapping at the end).
type offsets struct {
	seq    bool
	blocks uint64
	next   uint64
	bs     uint64
	rng    uint64 // xorshift state
}

func newOffsets(op string, sizeBytes int64, bs int, seed uint64) *offsets {
	return &offsets{seq: strings.HasPrefix(op, "seq"), blocks: uint64(sizeBytes) / uint64(bs), bs: uint64(bs), rng: seed*0x9e3779b97f4a7c15 | 1}
}

func (o *offsets) get() uint64 {
	if o.seq {
		b := o.next
		o.next++
		if o.next == o.blocks {
			o.next = 0
		}
		return b * o.bs
	}
	o.rng ^= o.rng << 13
	o.rng ^= o.rng >> 7
	o.rng ^= o.rng << 17
	return (o.rng % o.blocks) * o.bs
}

// FormatBytes prints 4096 as "4k", 1<<20 as "1m" (the CLI's own syntax).
func FormatBytes(n int64) string {
	for _, u := range []struct {
		s string
		v int64
	}{{"g", 1 << 30}, {"m", 1 << 20}, {"k", 1 << 10}} {
		if n >= u.v && n%u.v == 0 {
			return fmt.Sprintf("%d%s", n/u.v, u.s)
		}
	}
	return fmt.Sprint(n)
}

// ParseBytes reads "4096", "4k", "4K", "4KiB", "1m", "1MiB", "2g", "1GiB".
func ParseBytes(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "ib"), "b")
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'k':
			mult, t = 1<<10, t[:n-1]
		case 'm':
			mult, t = 1<<20, t[:n-1]
		case 'g':
			mult, t = 1<<30, t[:n-1]
		case 't':
			mult, t = 1<<40, t[:n-1]
		}
	}
	var v int64
	if _, err := fmt.Sscan(t, &v); err != nil || v <= 0 || fmt.Sprint(v) != t {
		return 0, fmt.Errorf("bad size %q (examples: 4k, 1m, 1GiB, 65536)", s)
	}
	if v > math.MaxInt64/mult {
		return 0, fmt.Errorf("size %q too large", s)
	}
	return v * mult, nil
}
