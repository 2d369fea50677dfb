package cpu

import (
	"bytes"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/iosched"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/runtime/internal/ring"
	"github.com/tutti-io/tutti/runtime/internal/staging"
	"github.com/tutti-io/tutti/sched"
	"github.com/tutti-io/tutti/uring/uringsim"
)

// loadLog is a mover.Loader that records what the restore reported.
type loadLog struct {
	mu      sync.Mutex
	layers  []int // LayersDone's n, in order
	failed  []mover.Miss
	valid   int
	corrupt []int
	done    chan mover.Result
}

func (l *loadLog) LayersDone(n int) { l.mu.Lock(); l.layers = append(l.layers, n); l.mu.Unlock() }
func (l *loadLog) Fail(i int, cause mover.Miss, _ error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failed = append(l.failed, cause)
	l.valid = min(l.valid, i)
}
func (l *loadLog) Valid(i int) bool    { l.mu.Lock(); defer l.mu.Unlock(); return i < l.valid }
func (l *loadLog) Corrupt(i int)       { l.mu.Lock(); l.corrupt = append(l.corrupt, i); l.mu.Unlock() }
func (l *loadLog) Done(r mover.Result) { l.done <- r }

// savedRun commits a run of k chunks of g whose layer objects hold pattern
// bytes, written by hand where the map's layout puts them, with their chunk
// CRCs.
func savedRun(t *testing.T, m *objmap.Map, g kvshape.Geometry, k int) (objmap.RunInfo, [][]byte) {
	t.Helper()
	rs, err := m.Allocate(k)
	if err != nil || len(rs) != 1 {
		t.Fatalf("allocate: %v %v", rs, err)
	}
	res := rs[0]
	cb := g.ChunkBytesPerLayer()
	crcs := make([]uint32, g.Layers*k)
	objects := make([][]byte, g.Layers)
	for l := range objects {
		obj := make([]byte, int64(k)*cb)
		for i := range obj {
			obj[i] = byte(i*7 + l*13 + 1)
		}
		writeAt(t, m, res.Place(), l, 0, obj)
		for c := range k {
			crcs[l*k+c] = objmap.CRC32C(obj[int64(c)*cb : int64(c+1)*cb])
		}
		objects[l] = obj
	}
	chain := make([]uint64, k)
	for i := range chain {
		chain[i] = uint64(100 + i)
	}
	if err := m.Commit([]objmap.CommitRequest{{Res: res, Chain: chain, ChunkCRCs: crcs}}); err != nil {
		t.Fatal(err)
	}
	info, ok := m.Lookup(res.ID)
	if !ok {
		t.Fatal("committed run unknown")
	}
	return info, objects
}

// writeAt writes b at byte off of layer layer's object of the run at p.
func writeAt(t *testing.T, m *objmap.Map, p objmap.Place, layer int, off int64, b []byte) {
	t.Helper()
	loc, err := m.Layout().Where(p, layer, 0)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(m.Files()[loc.File].Path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, loc.Offset+off); err != nil {
		t.Fatal(err)
	}
}

// TestMoverRestores drives PathCPU's mover through the mover interface
// alone: a planned restore of a run (spread over two directories) lands in
// the engine's pages, reports every layer done in order and ends; with a
// byte flipped on disk it fails the run as a CRC miss and reports it
// corrupt.
func TestMoverRestores(t *testing.T) {
	g := kvshape.Geometry{Layers: 4, KVHeads: 2, HeadDim: 16, DType: kvshape.BF16, Planes: 2, PageTokens: 4, ChunkPages: 2}
	const k, numPages = 5, 32
	for _, corrupt := range []bool{false, true} {
		m, err := objmap.Open(objmap.Options{Dirs: []string{t.TempDir(), t.TempDir()}, CapacityBytes: 16 << 20, Geometry: g, Buffered: true})
		if err != nil {
			t.Fatal(err)
		}
		if m.Layout().Width() != 2 {
			t.Fatalf("run width %d", m.Layout().Width())
		}
		info, objects := savedRun(t, m, g, k)
		if corrupt {
			writeAt(t, m, info.Place(), 1, 3, []byte{0xff ^ objects[1][3]})
		}
		st, err := staging.New(64<<10, 8<<10)
		if err != nil {
			t.Fatal(err)
		}
		w := ring.New("test", uringsim.New(uringsim.Config{Seed: 3}), 16)
		p := sched.DeviceProfile{ReadBytesPerSec: 2e9, WriteBytesPerSec: 1e9, ReadIOPS: 2e5, WriteIOPS: 1e5,
			ReadLatencyNs: 1e5, ReadShareUnderWrites: 0.5, WriteShareUnderReads: 0.5}
		sc, err := iosched.New(sched.Config{Layers: g.Layers, BlockTokens: g.ChunkPages * g.PageTokens,
			Compute: sched.ComputeModel{PerTokenNs: 1e6}, Devices: []sched.DeviceConfig{{Profile: p}, {Profile: p}}})
		if err != nil {
			t.Fatal(err)
		}
		var mv mover.Mover = New(Config{Geometry: g, Layout: kvshape.LayoutPerLayer, Pool: mover.Pool{Layout: m.Layout(), Files: m.Files()},
			NumPages: numPages, Staging: st, Worker: w, Sched: sc, Counters: &mover.Counters{}})
		kv := shiftedViews(t, g, kvshape.LayoutPerLayer, numPages, 0)
		if err := mv.Bind(kv.regions()); err != nil {
			t.Fatal(err)
		}
		runs := []mover.Run{{Info: &info, K: k}}
		if got := mv.Cut(runs, k); got != k || mv.Whole() {
			t.Fatalf("Cut %d, Whole %v: the CPU mover takes every block, read by read", got, mv.Whole())
		}
		ios := make(chan sched.IO, g.Layers)
		plan, err := sc.PlanLoad(sched.LoadRequest{Runs: []sched.Run{{Device: m.Layout().Device(info.File), LayerDevices: m.Layout().LayerDevices(info.File),
			Blocks: k, BytesPerLayerPerBlock: g.ChunkBytesPerLayer()}}}, ios)
		if err != nil || plan.LoadBlocks != k {
			t.Fatalf("plan %+v, %v", plan, err)
		}
		pages := []int32{9, 3, 17, 0, 30, 12, 5, 22, 1, 28}
		log := &loadLog{valid: 1, done: make(chan mover.Result, 1)}
		if sw := mv.Restore(&mover.Restore{Runs: runs, Pages: pages, Plan: plan, IOs: ios, Load: log}); sw != nil {
			t.Fatal("the CPU mover's restore offers a stream wait")
		}
		var res mover.Result
		select {
		case res = <-log.done:
		case <-time.After(10 * time.Second):
			t.Fatal("the restore never ended")
		}
		if res.IOs < int64(g.Layers) || res.Err != nil {
			t.Fatalf("result %+v", res)
		}
		if corrupt {
			if len(log.failed) == 0 || log.failed[0] != mover.MissCRC || len(log.corrupt) == 0 || log.corrupt[0] != 0 {
				t.Fatalf("flipped byte: failed %v, corrupt %v", log.failed, log.corrupt)
			}
		} else {
			if len(log.failed) != 0 || len(log.layers) == 0 || log.layers[len(log.layers)-1] != g.Layers {
				t.Fatalf("failed %v, layers done %v", log.failed, log.layers)
			}
			for l := range g.Layers {
				got := make([]byte, len(objects[l]))
				kv.CopyPages(l, pages, 0, int64(len(got)), got, false)
				if !bytes.Equal(got, objects[l]) {
					t.Fatalf("layer %d: the pages do not hold the run's object", l)
				}
			}
		}
		for i := 1; i < len(log.layers); i++ {
			if log.layers[i] <= log.layers[i-1] {
				t.Fatalf("layers done %v: not increasing", log.layers)
			}
		}
		if err := errors.Join(mv.Close(), w.Close(), st.Close(), m.Close()); err != nil {
			t.Fatal(err)
		}
		sc.Close()
	}
}
