package objmap

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
)

// oneDevice is the layout of a one-directory store of g: every run whole in
// its one file, the layout of every store before manifest version 3. The
// helpers below give its figures for a run at offset 0, so offsets are
// relative to the run's extent.
func oneDevice(g kvshape.Geometry) Layout {
	lay, err := NewLayout(g, 1, 1, 1)
	if err != nil {
		panic(err)
	}
	return lay
}

func runBytes1(g kvshape.Geometry, chunks int) int64 { return oneDevice(g).RunBytes(chunks) }

func chunksThatFit1(g kvshape.Geometry, extentBytes int64) int {
	return oneDevice(g).ChunksThatFit(extentBytes)
}

func objectOffset1(g kvshape.Geometry, runChunks, layer int) (int64, error) {
	loc, err := oneDevice(g).Where(Place{Chunks: runChunks}, layer, 0)
	return loc.Offset, err
}

func chunkSpan1(g kvshape.Geometry, runChunks, layer, first, k int) (Span, error) {
	return oneDevice(g).Span(Place{Chunks: runChunks}, layer, first, k)
}

func layerSpan1(g kvshape.Geometry, runChunks, layer, k int) (off, ioBytes, dataBytes int64, err error) {
	s, err := chunkSpan1(g, runChunks, layer, 0, k)
	return s.Off, s.IOBytes, s.DataBytes, err
}

// TestPlacementRule pins the placement rule (layout.go) by hand-computed
// cases: which file, device and offset a (run, layer, chunk) gets.
func TestPlacementRule(t *testing.T) {
	g := kvshape.Geometry{Layers: 8, KVHeads: 1, HeadDim: 1024, DType: kvshape.FP32, Planes: 1, PageTokens: 1, ChunkPages: 1} // 4 KiB per chunk and layer
	hr := HeaderRegionBytes(g, 3)                                                                                             // 8 KiB: header and table
	stride := ObjectStride(g, 3)                                                                                              // 12 KiB
	for _, tc := range []struct {
		dirs, files, width int
		home               int
		off                int64
		layer, chunk       int
		want               Location
	}{
		// One device: the original layout, objects one after another.
		{1, 1, 1, 0, 0, 0, 0, Location{0, 0, hr}},
		{1, 1, 1, 0, 0, 5, 2, Location{0, 0, hr + 5*stride + 2*4096}},
		// Width 1 over 4 directories: a run lies whole in its home file.
		{4, 1, 1, 2, 1 << 20, 3, 1, Location{2, 2, 1<<20 + hr + 3*stride + 4096}},
		// Width 4 over 4 directories, home file 0: layer l on device l%4,
		// slot l/4.
		{4, 1, 4, 0, 0, 0, 0, Location{0, 0, hr}},
		{4, 1, 4, 0, 0, 1, 0, Location{1, 1, hr}},
		{4, 1, 4, 0, 0, 3, 2, Location{3, 3, hr + 2*4096}},
		{4, 1, 4, 0, 0, 4, 0, Location{0, 0, hr + stride}},
		{4, 1, 4, 0, 0, 5, 1, Location{1, 1, hr + stride + 4096}},
		// Home file 2: layer l on device (2+l)%4.
		{4, 1, 4, 2, 40960, 0, 0, Location{2, 2, 40960 + hr}},
		{4, 1, 4, 2, 40960, 2, 0, Location{0, 0, 40960 + hr}},
		{4, 1, 4, 2, 40960, 5, 0, Location{3, 3, 40960 + hr + stride}},
		// Two files per directory: files 4..7 are the second group.
		{4, 2, 4, 6, 0, 3, 0, Location{1, 5, hr}},
		// Width 2 over 4 directories: groups {0,1} and {2,3}.
		{4, 1, 2, 3, 0, 0, 0, Location{3, 3, hr}},
		{4, 1, 2, 3, 0, 1, 0, Location{2, 2, hr}},
		{4, 1, 2, 3, 0, 4, 0, Location{3, 3, hr + 2*stride}},
		{4, 1, 2, 3, 0, 7, 0, Location{2, 2, hr + 3*stride}},
	} {
		name := fmt.Sprintf("%d dirs × %d, width %d, home %d: layer %d chunk %d", tc.dirs, tc.files, tc.width, tc.home, tc.layer, tc.chunk)
		lay, err := NewLayout(g, tc.dirs, tc.files, tc.width)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := lay.Where(Place{File: tc.home, Offset: tc.off, Chunks: 3}, tc.layer, tc.chunk)
		if err != nil || got != tc.want {
			t.Errorf("%s: %+v %v, want %+v", name, got, err, tc.want)
		}
		if dev := lay.LayerDevices(tc.home)[tc.layer]; dev != tc.want.Device {
			t.Errorf("%s: LayerDevices says device %d", name, dev)
		}
		sp, err := lay.Span(Place{File: tc.home, Offset: tc.off, Chunks: 3}, tc.layer, tc.chunk, 1)
		if err != nil || sp.File != got.File || sp.Device != got.Device || sp.Off != got.Offset || sp.IOBytes != 4096 {
			t.Errorf("%s: Span %+v %v", name, sp, err)
		}
	}
}

// TestLayoutSpreads: in every layout a run's objects lie inside its
// extent in the files of its stripe group, overlap nothing (no two objects,
// not the header region of the home file), and every device of the group
// holds floor or ceil of Layers/Width of them.
func TestLayoutSpreads(t *testing.T) {
	for _, layers := range []int{1, 2, 5, 32, 61, 80} {
		g := kvshape.Geometry{Layers: layers, KVHeads: 1, HeadDim: 1024, DType: kvshape.FP32, Planes: 1, PageTokens: 1, ChunkPages: 1}
		for _, dirs := range []int{1, 2, 3, 4, 8} {
			for _, files := range []int{1, 2} {
				lay, err := NewLayout(g, dirs, files, 0)
				if err != nil {
					t.Fatalf("%d layers over %d dirs: %v", layers, dirs, err)
				}
				if lay.Width() != RunWidth(layers, dirs) {
					t.Fatalf("width %d, RunWidth says %d", lay.Width(), RunWidth(layers, dirs))
				}
				if layers >= 8 && lay.Width() != dirs {
					t.Fatalf("%d layers over %d dirs: width %d, want every directory", layers, dirs, lay.Width())
				}
				if w := lay.Width(); w*lay.Slots()*maxSlotWaste > layers*(maxSlotWaste+1) {
					t.Fatalf("%d layers over width %d: %d slots", layers, w, w*lay.Slots())
				}
				for home := range lay.Files() {
					checkRunPlacement(t, lay, Place{File: home, Offset: 8 << 20, Chunks: 3})
				}
			}
		}
	}
}

func checkRunPlacement(t *testing.T, lay Layout, p Place) {
	t.Helper()
	g := lay.Geometry()
	group := lay.RunFiles(p.File, nil)
	used := map[int][][2]int64{p.File: {{p.Offset, p.Offset + HeaderRegionBytes(g, p.Chunks)}}}
	perDev := map[int]int{}
	for l := range g.Layers {
		loc, err := lay.Where(p, l, 0)
		if err != nil {
			t.Fatal(err)
		}
		lo, hi := loc.Offset, loc.Offset+ObjectStride(g, p.Chunks)
		if lay.Device(loc.File) != loc.Device || !contains(group, loc.File) || lo < p.Offset || hi > p.Offset+lay.RunBytes(p.Chunks) {
			t.Fatalf("%+v layer %d at %+v: outside the run's extent in its group %v", p, l, loc, group)
		}
		for _, u := range used[loc.File] {
			if lo < u[1] && u[0] < hi {
				t.Fatalf("%+v layer %d at %+v overlaps [%d,%d)", p, l, loc, u[0], u[1])
			}
		}
		used[loc.File] = append(used[loc.File], [2]int64{lo, hi})
		perDev[loc.Device]++
		last, err := lay.Where(p, l, p.Chunks-1)
		if err != nil || last.File != loc.File || last.Offset != loc.Offset+int64(p.Chunks-1)*g.ChunkBytesPerLayer() {
			t.Fatalf("%+v layer %d: last chunk at %+v %v", p, l, last, err)
		}
	}
	lo, hi := g.Layers/lay.Width(), (g.Layers+lay.Width()-1)/lay.Width()
	if len(perDev) != min(lay.Width(), g.Layers) {
		t.Fatalf("%+v: objects on %d devices, width %d", p, len(perDev), lay.Width())
	}
	for d, n := range perDev {
		if n < lo || n > hi {
			t.Fatalf("%+v: device %d holds %d objects, want %d..%d", p, d, n, lo, hi)
		}
	}
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestLayoutRefuses(t *testing.T) {
	g := kvshape.Geometry{Layers: 4, KVHeads: 1, HeadDim: 1024, DType: kvshape.FP32, Planes: 1, PageTokens: 1, ChunkPages: 1}
	for _, w := range []int{-1, 3, 8} {
		if _, err := NewLayout(g, 8, 1, w); err == nil {
			t.Errorf("width %d over 8 dirs of 4 layers accepted", w)
		}
	}
	lay, err := NewLayout(g, 4, 1, 4)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		p            Place
		layer, chunk int
	}{{Place{File: 4, Chunks: 1}, 0, 0}, {Place{File: 0, Offset: 100, Chunks: 1}, 0, 0}, {Place{Chunks: 2}, 4, 0}, {Place{Chunks: 2}, 0, 2}, {Place{Chunks: 0}, 0, 0}} {
		if _, err := lay.Where(tc.p, tc.layer, tc.chunk); !errors.Is(err, kvshape.ErrOutOfRange) {
			t.Errorf("Where(%+v, %d, %d): %v", tc.p, tc.layer, tc.chunk, err)
		}
	}
}

// editManifests sets (or, with nil, deletes) key in the MANIFEST of every
// directory.
func editManifests(t *testing.T, dirs []string, key string, v any) {
	t.Helper()
	for _, d := range dirs {
		path := filepath.Join(d, manifestName)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var raw map[string]any
		if err := json.Unmarshal(b, &raw); err != nil {
			t.Fatal(err)
		}
		if v == nil {
			delete(raw, key)
		} else {
			raw[key] = v
		}
		if b, err = json.Marshal(raw); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLayoutVersions: a store over several directories spreads its runs
// (manifest version 3, its run width recorded) and keeps that width; a
// store whose runs lie on one device (what every store before version 3
// is) is still written as version 2 and read as such, with a note that
// says what to do; manifests that disagree with their version are refused
// rather than misread.
func TestLayoutVersions(t *testing.T) {
	root := t.TempDir()
	dirs := []string{filepath.Join(root, "a"), filepath.Join(root, "b")}
	o := testOpts(t, dirs...)
	m := mustOpen(t, o)
	if w := m.Layout().Width(); w != 2 {
		t.Fatalf("2 layers over 2 directories: width %d", w)
	}
	runs := save(t, m, 3)
	for _, r := range runs {
		a, _ := m.Layout().Where(r.Place(), 0, 0)
		b, _ := m.Layout().Where(r.Place(), 1, 0)
		if a.Device == b.Device {
			t.Fatalf("run %d: both layers on device %d", r.ID, a.Device)
		}
	}
	m.Close()
	man, err := readManifest(dirs[0])
	if err != nil || man.Version != manifestVersion || man.RunWidth != 2 {
		t.Fatalf("manifest %+v %v, want version %d, run width 2", man, err, manifestVersion)
	}
	o1 := o
	o1.RunWidth = 1
	if _, err := Open(o1); !errors.Is(err, ErrSettingsMismatch) {
		t.Fatalf("reopening a width-2 store asking for width 1: %v", err)
	}
	for _, tc := range []struct {
		key string
		v   any
	}{{"version", 2}, {"run_width", nil}, {"run_width", 3}} {
		editManifests(t, dirs, tc.key, tc.v)
		if _, err := Open(o); !errors.Is(err, ErrCorruptStore) {
			t.Fatalf("manifest with %s = %v: %v", tc.key, tc.v, err)
		}
		editManifests(t, dirs, "version", manifestVersion)
		editManifests(t, dirs, "run_width", 2)
	}
	m = mustOpen(t, o)
	for _, r := range runs {
		readBack(t, m, r, 1, r.Chunks())
	}
	m.Close()

	// The layout before version 3: each run whole on one device.
	old := []string{filepath.Join(root, "c"), filepath.Join(root, "d")}
	o = testOpts(t, old...)
	o.RunWidth = 1
	m = mustOpen(t, o)
	runs = save(t, m, 4)
	m.Close()
	man, err = readManifest(old[0])
	if err != nil || man.Version != 2 || man.RunWidth != 0 {
		t.Fatalf("width-1 manifest %+v %v, want version 2 without a run width", man, err)
	}
	editManifests(t, old, "version", 1)
	o.RunWidth = 0
	m = mustOpen(t, o)
	defer m.Close()
	if w := m.Layout().Width(); w != 1 {
		t.Fatalf("a version 1 store read with width %d", w)
	}
	for _, r := range runs {
		for l := range m.Geometry().Layers {
			if loc, _ := m.Layout().Where(r.Place(), l, 0); loc.File != r.File {
				t.Fatalf("run %d layer %d in file %d, its home is %d", r.ID, l, loc.File, r.File)
			}
			readBack(t, m, r, l, r.Chunks())
		}
	}
	if note := m.Recovery().LayoutNote(); !strings.Contains(note, "remove its files") {
		t.Fatalf("layout note %q", note)
	}
}
