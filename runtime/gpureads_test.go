package runtime

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/uring/blockdev"
)

// TestDeviceSizedGPUReads: the sizing rule on the test machine's disk (when
// the temporary directory is on one) and on directories whose device does
// not say (procfs), which add 128 reads with no queue to stay within and take
// 1 MiB reads, and are named in Unread. Every sized value is within Validate's ranges.
func TestDeviceSizedGPUReads(t *testing.T) {
	tmp := t.TempDir()
	perDisk, diskRead := 128, 1<<20 // what an unknown device counts as
	diskQueue := gpuUnknownQueue    // ... and its queue: none to stay within
	onDisk := true
	if d, err := blockdev.QueueDepth(tmp); err == nil {
		perDisk, diskQueue = GPUReadWindow([]int{d}), d
		m, err := blockdev.MaxReadBytes(tmp)
		if err != nil {
			t.Fatal(err)
		}
		diskRead = min(4<<20, m)
	} else if errors.Is(err, blockdev.ErrNoBlockDevice) {
		onDisk = false
	} else {
		t.Fatal(err)
	}
	notYet := filepath.Join(tmp, "not", "created")
	procs := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = "/proc"
		}
		return out
	}
	for _, tc := range []struct {
		name                    string
		dirs                    []string
		window, maxIO, lookhead int
		unread                  int // lines in Unread
	}{
		{"none", nil, 128, 1 << 20, 2, 0},
		{"one disk", []string{tmp}, perDisk, diskRead, 2, 0},
		{"not created yet: its parent's disk", []string{notYet}, perDisk, diskRead, 2, 0},
		{"four on one disk count four times, within its queue", []string{tmp, tmp, tmp, tmp}, min(4*perDisk, diskQueue, 1024), diskRead, 4, 0},
		{"unknown device", []string{"/proc"}, 128, 1 << 20, 2, 2},
		{"disk and unknown: smallest read", []string{tmp, "/proc"}, min(perDisk+128, diskQueue), min(diskRead, 1<<20), 2, 2},
		{"window at most 1024, lookahead at most 8", procs(10), 1024, 1 << 20, 8, 20},
	} {
		if !onDisk && tc.unread == 0 && len(tc.dirs) > 0 {
			tc.unread = 2 * len(tc.dirs)
		}
		r := DeviceSizedGPUReads(tc.dirs)
		if r.Window != tc.window || r.MaxIOBytes != tc.maxIO || r.Lookahead != tc.lookhead || len(r.Unread) != tc.unread || r.Dirs != len(tc.dirs) {
			t.Errorf("%s: %+v, want window %d, largest read %d, lookahead %d, %d unread", tc.name, r, tc.window, tc.maxIO, tc.lookhead, tc.unread)
		}
		for _, u := range r.Unread {
			if !strings.Contains(u, "counting 128 for it") && !strings.Contains(u, "using 1 MiB for it") {
				t.Errorf("%s: unread line %q does not say what was assumed", tc.name, u)
			}
		}
		if tc.unread > 0 && !strings.Contains(r.String(), "not read: ") {
			t.Errorf("%s: String() = %q hides what was not read", tc.name, r)
		}
		c := Config{Dirs: []string{"/a"}, CapacityBytes: 1 << 30, Geometry: tinyGeometry(), Layout: kvshape.LayoutPerLayer, NumPages: 16,
			GPU: GPUConfig{IOWindow: r.Window, MaxIOBytes: r.MaxIOBytes, Lookahead: r.Lookahead}}
		if err := c.Validate(); err != nil {
			t.Errorf("%s: sized values refused: %v", tc.name, err)
		}
		t.Logf("%s: %s", tc.name, r)
	}
}

func TestGPUReadsExplicitWin(t *testing.T) {
	r := GPUReads{Window: 384, MaxIOBytes: 1 << 20, Lookahead: 4}
	for _, tc := range []struct {
		w, m, l int
		want    [3]int
	}{
		{0, 0, 0, [3]int{384, 1 << 20, 4}},
		{64, 0, 0, [3]int{64, 1 << 20, 4}},
		{0, 4 << 20, 0, [3]int{384, 4 << 20, 4}},
		{0, 0, 1, [3]int{384, 1 << 20, 1}},
		{8, 8192, 16, [3]int{8, 8192, 16}},
	} {
		got := r.Explicit(tc.w, tc.m, tc.l)
		if [3]int{got.Window, got.MaxIOBytes, got.Lookahead} != tc.want {
			t.Errorf("Explicit(%d, %d, %d) = %+v, want %v", tc.w, tc.m, tc.l, got, tc.want)
		}
	}
}

func TestGPULookaheadToFill(t *testing.T) {
	for _, tc := range []struct {
		window, maxIO, dirs int
		layerBytes          int64
		want                int
	}{
		{384, 1 << 20, 4, 36 << 20, 11}, // MLA-sized layers: ceil(384 MiB / 36 MiB)
		{384, 1 << 20, 4, 1 << 30, 4},   // large layers: one per directory
		{64, 1 << 20, 1, 1 << 30, 2},    // at least 2
		{1024, 4 << 20, 1, 1 << 20, 16}, // at most 16
		{128, 1 << 20, 1, 0, 16},        // no layer size: as full as allowed
		{128, 1 << 20, 1, 128 << 20, 2}, // exactly one layer fills it
	} {
		if got := GPULookaheadToFill(tc.window, tc.maxIO, tc.dirs, tc.layerBytes); got != tc.want {
			t.Errorf("GPULookaheadToFill(%d, %d, %d, %d) = %d, want %d", tc.window, tc.maxIO, tc.dirs, tc.layerBytes, got, tc.want)
		}
	}
}

// TestSizeGPUReads: the GPU path sizes the fields left 0 from the devices
// (the lookahead to fill the window), keeps the ones set, and says so, in
// Stats.GPU.Reads too.
func TestSizeGPUReads(t *testing.T) {
	base := testConfig(t, tinyGeometry(), kvshape.LayoutPerLayer, 64)
	base.Dirs = []string{t.TempDir(), t.TempDir()}
	sized := DeviceSizedGPUReads(base.Dirs)
	layer := int64(min(base.NumPages, 4096)) * base.Geometry.PageBytesPerLayer()
	fill := GPULookaheadToFill(sized.Window, sized.MaxIOBytes, 2, layer)
	for _, tc := range []struct {
		name    string
		edit    func(*Config)
		w, m, l int
	}{
		{"sized", func(*Config) {}, sized.Window, sized.MaxIOBytes, fill},
		{"explicit window wins", func(c *Config) { c.GPU.IOWindow = 32 }, 32, sized.MaxIOBytes,
			GPULookaheadToFill(32, sized.MaxIOBytes, 2, layer)},
		{"explicit read and lookahead win", func(c *Config) { c.GPU.MaxIOBytes, c.GPU.Lookahead = 8192, 3 }, sized.Window, 8192, 3},
	} {
		cfg := base
		tc.edit(&cfg)
		cfg = cfg.withDefaults()
		note := cfg.sizeGPUReads().String()
		if cfg.GPU.IOWindow != tc.w || cfg.GPU.MaxIOBytes != tc.m || cfg.GPU.Lookahead != tc.l {
			t.Errorf("%s: window %d, largest read %d, lookahead %d; want %d, %d, %d", tc.name,
				cfg.GPU.IOWindow, cfg.GPU.MaxIOBytes, cfg.GPU.Lookahead, tc.w, tc.m, tc.l)
		}
		if want := sized.Explicit(tc.w, tc.m, tc.l).String(); note != want {
			t.Errorf("%s: note %q, want %q", tc.name, note, want)
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: sized values refused: %v", tc.name, err)
		}
	}
	s, err := Open(base)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, want := s.Stats().GPU.Reads.String(), sized.Explicit(0, 0, fill).String(); got != want {
		t.Errorf("Stats.GPU.Reads = %q, want %q", got, want)
	}
}

// TestWindowFor: the shares summed, within the smallest request queue.
func TestWindowFor(t *testing.T) {
	const u = gpuUnknownQueue // a device that does not say
	for _, tc := range []struct {
		name       string
		nrRequests []int
		want       int
	}{
		{"one loop device", []int{128}, 64},
		{"four loop devices: one may hold the whole window", []int{128, 128, 128, 128}, 128},
		{"a virtio disk", []int{256}, 128},
		{"two on one virtio disk", []int{256, 256}, 256},
		{"a shallow device caps a deep one", []int{1023, 32}, 32},
		{"eight NVMe drives", []int{1023, 1023, 1023, 1023, 1023, 1023, 1023, 1023}, 1023},
		{"nine unknown devices: at most 1024", []int{u, u, u, u, u, u, u, u, u}, 1024},
		{"unknown and a loop device", []int{u, 128}, 128},
	} {
		if got := GPUReadWindow(tc.nrRequests); got != tc.want {
			t.Errorf("%s: GPUReadWindow(%v) = %d, want %d", tc.name, tc.nrRequests, got, tc.want)
		}
	}
}

// TestDeviceWindow: half a device's request queue, 8..128.
func TestDeviceWindow(t *testing.T) {
	for _, tc := range []struct{ nrRequests, want int }{
		{128, 64}, // a loop device: 3/4 (96) still sent reads to io-wq workers
		{256, 128}, {1023, 128}, {64, 32}, {10, 8}, {2, 8}, {gpuUnknownQueue, 128},
	} {
		if got := GPUReadWindow([]int{tc.nrRequests}); got != min(tc.want, tc.nrRequests) {
			t.Errorf("nr_requests %d: window %d, want %d", tc.nrRequests, got, tc.want)
		}
	}
}
