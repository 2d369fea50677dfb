package runtime

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime/internal/nodewire"
)

// TestConnectedPlacesByTheServiceLayout: an engine connected to a service
// over four directories places its bytes by the service's layout, which
// its hello sent: what the engine saves it writes spread over the four
// devices, and a store opened on the directories once the service closed
// restores it byte for byte; what that store saved, an engine connected to
// a new service restores byte for byte. (Two engines that placed bytes by
// some other rule of their own would still agree with each other, so the
// test crosses the wire against the store's own placement.)
func TestConnectedPlacesByTheServiceLayout(t *testing.T) {
	g := kvshape.Geometry{Layers: 8, KVHeads: 2, HeadDim: 16, DType: kvshape.BF16, Planes: 2, PageTokens: 4, ChunkPages: 64} // 16 KiB per block and layer
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 8*g.ChunkPages)
	cfg.Dirs = []string{t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()}
	rng := rand.New(rand.NewPCG(50, 46))
	saved, local := chainOf(0x46, 3), chainOf(0x50, 2)

	v := startService(t, cfg)
	e, kv := connectKV(t, v, cfg)
	if lay, want := e.layout(), v.s.m.Layout(); lay.Width() != 4 || lay.Width() != want.Width() || lay.Files() != want.Files() || lay.Dirs() != want.Dirs() {
		t.Fatalf("engine's layout: width %d, %d files over %d dirs; the service's: width %d, %d files over %d dirs",
			lay.Width(), lay.Files(), lay.Dirs(), want.Width(), want.Files(), want.Dirs())
	}
	pages := pageTable(rng, g, cfg.NumPages, len(saved))
	fill(kv, g, saved, pages)
	if sv := saveWait(t, e, saved, pages); sv.Saved() != len(saved) {
		t.Fatalf("connected save: saved %d of %d", sv.Saved(), len(saved))
	}
	// One run of 3 blocks (too small to cut): 2 of its 8 layers on each device.
	perDev := 2 * int64(len(saved)) * g.ChunkBytesPerLayer()
	st := e.Stats().Devices
	if !slices.Equal(st.Dirs, v.s.m.Dirs()) {
		t.Fatalf("engine's devices %v, the service's %v", st.Dirs, v.s.m.Dirs())
	}
	for i, w := range st.WriteBytes {
		if w != perDev {
			t.Fatalf("engine wrote %v bytes per device, want %d on each (device %d)", st.WriteBytes, perDev, i)
		}
	}
	closeKV(t, e, kv)
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}

	s, kv := openKV(t, cfg)
	scramble(kv, g, cfg.NumPages)
	if l := loadWait(t, s, saved, pages); l.Blocks() != len(saved) {
		t.Fatalf("opened store restores %d of the %d blocks the engine saved: %v", l.Blocks(), len(saved), l.Failure())
	}
	if err := verify(kv, g, saved, pages, len(saved)); err != nil {
		t.Fatalf("what the engine saved, as the store reads it: %v", err)
	}
	lpages := pageTable(rng, g, cfg.NumPages, len(local))
	fill(kv, g, local, lpages)
	if sv := saveWait(t, s, local, lpages); sv.Saved() != len(local) {
		t.Fatalf("local save: saved %d of %d", sv.Saved(), len(local))
	}
	closeKV(t, s, kv)

	v = startService(t, cfg)
	defer func() { _ = v.Close() }()
	e, kv = connectKV(t, v, cfg)
	defer closeKV(t, e, kv)
	scramble(kv, g, cfg.NumPages)
	if l := loadWait(t, e, local, lpages); l.Blocks() != len(local) {
		t.Fatalf("engine restores %d of the %d blocks the store saved: %v", l.Blocks(), len(local), l.Failure())
	}
	if err := verify(kv, g, local, lpages, len(local)); err != nil {
		t.Fatalf("what the store saved, as the engine reads it: %v", err)
	}
	perDev = 2 * int64(len(local)) * g.ChunkBytesPerLayer()
	for i, r := range e.Stats().Devices.ReadBytes {
		if r != perDev {
			t.Fatalf("engine read %v bytes per device, want %d on each (device %d)", e.Stats().Devices.ReadBytes, perDev, i)
		}
	}
}

// TestHelloLayout: an engine builds its layout from the service's hello
// and refuses one it would have to complete itself or whose files are not
// the ones named.
func TestHelloLayout(t *testing.T) {
	g := tinyGeometry() // 3 layers
	dirs, files := []string{"/a", "/b"}, []string{"/a/0", "/b/1", "/a/2", "/b/3"}
	for _, tc := range []struct {
		name  string
		h     nodewire.HelloResp
		width int // 0: refused
	}{
		{"spread", nodewire.HelloResp{Dirs: dirs, Files: files, FilesPerDir: 2, RunWidth: 2}, 2},
		{"one device", nodewire.HelloResp{Dirs: dirs, Files: files, FilesPerDir: 2, RunWidth: 1}, 1},
		{"no width", nodewire.HelloResp{Dirs: dirs, Files: files, FilesPerDir: 2}, 0},
		{"no files per dir", nodewire.HelloResp{Dirs: dirs, Files: files, RunWidth: 2}, 0},
		{"no dirs", nodewire.HelloResp{Files: files, FilesPerDir: 2, RunWidth: 1}, 0},
		{"files not the layout's", nodewire.HelloResp{Dirs: dirs, Files: files[:3], FilesPerDir: 2, RunWidth: 2}, 0},
		{"width beyond the dirs", nodewire.HelloResp{Dirs: dirs, Files: files, FilesPerDir: 2, RunWidth: 4}, 0},
	} {
		lay, err := helloLayout(Config{Geometry: g}, &tc.h)
		switch {
		case tc.width == 0 && !errors.Is(err, nodewire.ErrProtocol):
			t.Errorf("%s: %v, want ErrProtocol", tc.name, err)
		case tc.width != 0 && (err != nil || lay.Width() != tc.width || lay.Files() != len(tc.h.Files)):
			t.Errorf("%s: width %d, %d files, %v; want width %d", tc.name, lay.Width(), lay.Files(), err, tc.width)
		}
	}
}
