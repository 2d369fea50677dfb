package runtime

import (
	"errors"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
)

func TestConfigValidate(t *testing.T) {
	good := func() Config {
		return Config{Dirs: []string{"/a", "/b"}, CapacityBytes: 1 << 30, Geometry: tinyGeometry(),
			Layout: kvshape.LayoutPerLayer, NumPages: 16}
	}
	if err := func() error { c := good(); return c.Validate() }(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	cases := []struct {
		field string
		edit  func(*Config)
	}{
		{"Dirs", func(c *Config) { c.Dirs = nil }},
		{"Dirs[1]", func(c *Config) { c.Dirs = []string{"/a", ""} }},
		{"Dirs[1]", func(c *Config) { c.Dirs = []string{"/a", "/a"} }},
		{"CapacityBytes", func(c *Config) { c.CapacityBytes = 0 }},
		{"Geometry", func(c *Config) { c.Geometry.Layers = 0 }},
		{"Layout", func(c *Config) { c.Layout = 7 }},
		{"NumPages", func(c *Config) { c.NumPages = -1 }},
		{"Path", func(c *Config) { c.Path = 9 }},
		{"QueueDepth", func(c *Config) { c.QueueDepth = 1 << 20 }},
		{"RunWidth", func(c *Config) { c.RunWidth = -1 }},
		{"RunWidth", func(c *Config) { c.RunWidth = len(c.Dirs) + 1 }},
		{"SaveWritesPerDevice", func(c *Config) { c.SaveWritesPerDevice = maxSaveWrites + 1 }},
		{"SaveWritesPerDevice", func(c *Config) { c.SaveWritesPerDevice = -1 }},
		{"StagingBytes", func(c *Config) { c.StagingBytes = -1 }},
		{"StagingSlotBytes", func(c *Config) { c.StagingSlotBytes = 4097 }},
		{"StagingBytes", func(c *Config) { c.StagingBytes, c.StagingSlotBytes = 12288, 8192 }},
		{"StagingBytes", func(c *Config) { c.StagingBytes, c.StagingSlotBytes = 8192, 8192 }},
		{"StagingSlotBytes", func(c *Config) {
			c.Geometry = kvshape.Geometry{Layers: 1, KVHeads: 8, HeadDim: 128, DType: kvshape.FP32, Planes: 2, PageTokens: 16, ChunkPages: 1}
			c.StagingBytes, c.StagingSlotBytes = 1<<20, 64<<10
		}},
		{"StagingBytes", func(c *Config) { c.StagingBytes = 4096 }},
		{"SaveBoundMs", func(c *Config) { c.SaveBoundMs = -5 }},
		{"SaveBudgetBytes", func(c *Config) { c.SaveBudgetBytes = -5 }},
		{"MaxLoads", func(c *Config) { c.MaxLoads = -1 }},
		{"GPU.IOWindow", func(c *Config) { c.GPU.IOWindow = 5000 }},
		{"GPU.MaxIOBytes", func(c *Config) { c.GPU.MaxIOBytes = 4097 }},
		{"GPU.MaxIOBytes", func(c *Config) { c.GPU.MaxIOBytes = 32 << 20 }},
		{"GPU.Lookahead", func(c *Config) { c.GPU.Lookahead = 17 }},
	}
	for _, tc := range cases {
		c := good()
		tc.edit(&c)
		err := c.Validate()
		if err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.field+":") {
			t.Errorf("%s: Validate() = %v, want an ErrConfig naming %s", tc.field, err, tc.field)
		}
	}
}

// TestRequestChecks: every bad argument is an error naming it, before any
// I/O; a second Open of the same directories is refused.
func TestRequestChecks(t *testing.T) {
	g := tinyGeometry()
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 8)
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Load([]uint64{1}, []int32{0, 1}); !errors.Is(err, ErrNoKV) {
		t.Fatalf("Load before RegisterKV: %v", err)
	}
	kv, err := AllocHostKV(g, kvshape.LayoutPerLayer, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Free()
	mem := kv.Memory()
	short := mem
	short.Layers = append([]Region(nil), mem.Layers...)
	short.Layers[2].LenBytes--
	for name, bad := range map[string]KVMemory{
		"Layers[2]":    short,
		"3 layers":     {Layers: mem.Layers[:2]},
		"Cross is set": {Layers: mem.Layers, Cross: Region{Addr: 1, LenBytes: 1}},
	} {
		if err := s.RegisterKV(bad); !errors.Is(err, ErrKV) || !strings.Contains(err.Error(), strings.Fields(name)[0]) {
			t.Errorf("RegisterKV(%s) = %v", name, err)
		}
	}
	if err := s.RegisterKV(mem); err != nil {
		t.Fatal(err)
	}
	if err := s.RegisterKV(mem); !errors.Is(err, ErrKV) {
		t.Fatalf("second RegisterKV: %v", err)
	}
	for name, tc := range map[string]struct {
		chain []uint64
		pages []int32
		want  error
		says  string
	}{
		"empty":    {nil, nil, ErrBadRequest, "empty chain"},
		"too few":  {[]uint64{1, 2}, []int32{0, 1, 2}, ErrBadRequest, "need 4 page ids"},
		"negative": {[]uint64{1, 2}, []int32{0, 1, -1, 3}, ErrKV, "pages[2] = -1"},
		"past end": {[]uint64{1}, []int32{0, 8}, ErrKV, "pages[1] = 8"},
	} {
		if _, err := s.Load(tc.chain, tc.pages); !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("Load %s: %v", name, err)
		}
		if _, err := s.Save(tc.chain, tc.pages); !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("Save %s: %v", name, err)
		}
	}
	if _, err := Open(cfg); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open of the same dirs: %v, want ErrLocked", err)
	}
	if l := s.Lookup([]uint64{1, 2, 3}); l != 0 {
		t.Fatalf("Lookup on an empty store = %d", l)
	}
	if _, err := Open(Config{Dirs: cfg.Dirs, CapacityBytes: cfg.CapacityBytes, Geometry: g, Layout: kvshape.LayoutPerLayer,
		NumPages: 8, Path: PathGPU}); !errors.Is(err, ErrGPUUnavailable) {
		t.Fatalf("Open with PathGPU here: %v, want ErrGPUUnavailable", err)
	}
}

// FuzzConfigValidate: Validate never panics, and a config it accepts has
// usable defaults (slots that divide staging, at least two).
func FuzzConfigValidate(f *testing.F) {
	f.Add(64, int64(1<<30), 4, 2, 16, uint8(1), 2, 16, 1, uint8(0), 16, 0, int64(0), int64(0), 0, int64(0))
	f.Add(3, int64(1), 1, 1, 576, uint8(4), 1, 64, 32, uint8(1), 1<<20, 9, int64(8192), int64(0), -1, int64(-1))
	f.Fuzz(func(t *testing.T, numPages int, capacity int64, layers, heads, dim int, dtype uint8, planes, pageTokens, chunkPages int,
		layout uint8, depth, path int, staging, slot int64, boundMs int, budget int64) {
		c := Config{Dirs: []string{"/d"}, CapacityBytes: capacity, NumPages: numPages,
			Geometry: kvshape.Geometry{Layers: layers, KVHeads: heads, HeadDim: dim, DType: kvshape.DType(dtype), Planes: planes,
				PageTokens: pageTokens, ChunkPages: chunkPages},
			Layout: kvshape.Layout(layout), QueueDepth: depth, Path: Path(path), StagingBytes: staging, StagingSlotBytes: slot,
			SaveBoundMs: boundMs, SaveBudgetBytes: budget}
		if c.Validate() != nil {
			return
		}
		w := c.withDefaults()
		if w.StagingSlotBytes <= 0 || w.StagingBytes%w.StagingSlotBytes != 0 || w.StagingBytes/w.StagingSlotBytes < 2 {
			t.Fatalf("accepted %+v with staging %d / slot %d", c, w.StagingBytes, w.StagingSlotBytes)
		}
	})
}

// TestOpenWithFallback: where the GPU path cannot run, OpenWithFallback opens
// the CPU path and counts it with the reason; Open never does.
func TestOpenWithFallback(t *testing.T) {
	cfg := testConfig(t, tinyGeometry(), kvshape.LayoutPerLayer, 8)
	cfg.Path = PathGPU
	s, err := Open(cfg)
	if err == nil {
		s.Close()
		t.Skip("the GPU path runs here")
	}
	if !errors.Is(err, ErrGPUUnavailable) {
		t.Fatalf("Open(PathGPU) = %v, want ErrGPUUnavailable", err)
	}
	s, err = OpenWithFallback(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st := s.Stats()
	if s.Config().Path != PathCPU || st.Path.Used != PathCPU || st.Path.Fallbacks != 1 || !strings.Contains(st.Path.FallbackReason, "GPU path unavailable") {
		t.Fatalf("after fallback: path %v, stats %+v", s.Config().Path, st.Path)
	}
}

// TestCapacityForBlocks: a store sized for n blocks admits n blocks saved as
// runs of one block (the worst case for headers and padding).
func TestCapacityForBlocks(t *testing.T) {
	g := tinyGeometry()
	const n = 300 // 4.8 MB of one-block runs: the 1 MiB of slack does not carry it
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 8)
	cfg.CapacityBytes = CapacityForBlocks(g, n)
	s, kv := openKV(t, cfg)
	defer closeKV(t, s, kv)
	pages := []int32{0, 1}
	for i := 0; i < n; i++ {
		sv := saveWait(t, s, []uint64{uint64(i + 1)}, pages)
		if sv.Saved() != 1 {
			t.Fatalf("block %d of %d not admitted: %v", i, n, s.Stats())
		}
	}
	if ev := s.idx.Stats().Evictions; ev != 0 {
		t.Fatalf("%d evictions storing %d blocks in a store sized for them", ev, n)
	}
}
