package runtime

import (
	"errors"
	"math/rand/v2"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/tutti-io/tutti/kvevents"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/mover/gpu/gputest"
	"github.com/tutti-io/tutti/runtime/internal/nodewire"
)

// startService serves a test store on a socket in a temporary directory.
func startService(t *testing.T, cfg Config) *Service {
	t.Helper()
	v, err := Serve(cfg, filepath.Join(t.TempDir(), "tutti.sock"))
	if err != nil {
		t.Fatalf("Serve: %v", err)
	}
	return v
}

// connectKV connects an engine to v with fresh host KV memory.
func connectKV(t *testing.T, v *Service, cfg Config) (*Store, *HostKV) {
	t.Helper()
	cfg.Dirs, cfg.CapacityBytes = nil, 0 // the service's
	s, err := Connect(v.Socket(), cfg)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	kv, err := AllocHostKV(cfg.Geometry, cfg.Layout, cfg.NumPages)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RegisterKV(kv.Memory()); err != nil {
		t.Fatal(err)
	}
	return s, kv
}

// TestServiceSharesPrefixes: a prefix one engine saved is a hit for
// another, loaded byte for byte into its own memory; a load pins what it
// reads; what a closed connection held is released.
func TestServiceSharesPrefixes(t *testing.T) {
	g := tinyGeometry()
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 64)
	v := startService(t, cfg)
	a, kva := connectKV(t, v, cfg)
	b, kvb := connectKV(t, v, cfg)
	rng := rand.New(rand.NewPCG(1, 2))
	chain := chainOf(0x5e, 12)
	pa := pageTable(rng, g, cfg.NumPages, len(chain))
	fill(kva, g, chain, pa)
	sv, err := a.Save(chain, pa)
	if err != nil {
		t.Fatal(err)
	}
	sv.Wait()
	if err := a.WaitSaves(); err != nil || sv.Saved() != len(chain) {
		t.Fatalf("saved %d of %d: %v", sv.Saved(), len(chain), err)
	}
	if n := b.Lookup(chain); n != len(chain) {
		t.Fatalf("engine b finds %d of %d blocks", n, len(chain))
	}
	pb := pageTable(rng, g, cfg.NumPages, len(chain))
	scramble(kvb, g, cfg.NumPages)
	l, err := b.Load(chain, pb)
	if err != nil {
		t.Fatal(err)
	}
	// While b's load pins the prefix, a discard of it leaves it readable.
	if err := l.Wait(); err != nil || l.Blocks() != len(chain) {
		t.Fatalf("loaded %d of %d: %v (%v)", l.Blocks(), len(chain), err, l.Failure())
	}
	if err := verify(kvb, g, chain, pb, len(chain)); err != nil {
		t.Fatal(err)
	}
	// A second save of the same prefix by b is all cached.
	sv2, err := b.Save(chain, pb)
	if err != nil {
		t.Fatal(err)
	}
	sv2.Wait()
	if sv2.Skipped(SkipCached) != len(chain) {
		t.Fatalf("b's save of a's prefix: %d cached of %d", sv2.Skipped(SkipCached), len(chain))
	}
	if _, _, _, err := a.TakeKVEvents(nil, 1<<20); !errors.Is(err, ErrBadRequest) {
		t.Errorf("TakeKVEvents of a connected store: %v", err)
	}
	// A hold that is never released is released by closing the connection.
	h, err := b.Match(chain, 0, 1<<40)
	if err != nil || h.Blocks() != len(chain) {
		t.Fatalf("match: %v", err)
	}
	closeKV(t, b, kvb)
	waitLive(t, v, 1)
	if st := v.Stats(); st.ReleasedPins != 1 {
		t.Errorf("released pins %d, want 1 (the hold)", st.ReleasedPins)
	}
	if n, err := a.Discard(chain[0]); err != nil || n != len(chain) {
		t.Errorf("discard after b closed: %d blocks, %v", n, err)
	}
	if st := a.Stats().Service; st.Socket != v.Socket() || st.ControlErrors != 0 {
		t.Errorf("a's link: %+v", st)
	}
	// The service gone, a's calls fail: misses and skipped saves, counted.
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if n := a.Lookup(chain); n != 0 {
		t.Errorf("lookup without a service: %d", n)
	}
	sv3, err := a.Save(chainOf(0x77, 2), pa[:2*g.ChunkPages])
	if err != nil {
		t.Fatal(err)
	}
	sv3.Wait()
	if sv3.Saved() != 0 || sv3.Skipped(SkipIOError) != 2 {
		t.Errorf("save without a service: saved %d, io-error %d", sv3.Saved(), sv3.Skipped(SkipIOError))
	}
	if st := a.Stats().Service; st.ControlErrors == 0 || st.LastError == "" {
		t.Errorf("a's link after the service closed: %+v", st)
	}
	_ = a.WaitSaves()
	closeKV(t, a, kva)
}

// waitLive waits until the service has released closed connections down
// to live (it notices a close asynchronously).
func waitLive(t *testing.T, v *Service, live int) {
	t.Helper()
	for i := 0; v.Stats().Live != live; i++ {
		if i == 1000 {
			t.Fatalf("service has %d connections, want %d", v.Stats().Live, live)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rawPeer is a connection that speaks the wire itself, to die at a chosen
// step.
type rawPeer struct {
	t  *testing.T
	c  net.Conn
	id uint64
}

func dialRaw(t *testing.T, v *Service, g kvshape.Geometry) *rawPeer {
	t.Helper()
	c, err := net.Dial("unix", v.Socket())
	if err != nil {
		t.Fatal(err)
	}
	p := &rawPeer{t: t, c: c}
	p.call(nodewire.OpHello, &nodewire.Hello{Version: nodewire.Version, Fingerprint: fingerprint(g)})
	return p
}

func (p *rawPeer) call(op nodewire.Op, req nodewire.Msg) nodewire.Msg {
	p.t.Helper()
	p.id++
	e := nodewire.Enc{}
	req.Encode(&e)
	if _, err := p.c.Write(nodewire.AppendFrame(nil, op, p.id, e.B)); err != nil {
		p.t.Fatal(err)
	}
	f, _, err := nodewire.ReadFrame(p.c, nil)
	if err != nil {
		p.t.Fatal(err)
	}
	m, rerr, err := nodewire.DecodeResponse(f.Op, f.Payload)
	if err != nil || rerr != nil {
		p.t.Fatalf("op %d: %v, %v", op, rerr, err)
	}
	return m
}

// TestServiceReleasesADeadPeer: a connection that reserved blocks, held a
// pool reservation and a pin, then closed mid-save (as a killed engine's
// does) leaves nothing reserved, nothing pending and nothing pinned; its
// blocks were never served.
func TestServiceReleasesADeadPeer(t *testing.T) {
	g := tinyGeometry()
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 64)
	v := startService(t, cfg)
	defer v.Close()
	a, kva := connectKV(t, v, cfg)
	defer closeKV(t, a, kva)
	rng := rand.New(rand.NewPCG(3, 4))
	saved := chainOf(0x1, 4)
	pa := pageTable(rng, g, cfg.NumPages, len(saved))
	fill(kva, g, saved, pa)
	sv, err := a.Save(saved, pa)
	if err != nil {
		t.Fatal(err)
	}
	sv.Wait()

	p := dialRaw(t, v, g)
	half := chainOf(0x100, 3)
	if r := p.call(nodewire.OpReserve, &nodewire.Reserve{Chain: half}).(*nodewire.ReserveResp); r.N != len(half) {
		t.Fatalf("reserved %d", r.N)
	}
	if r := p.call(nodewire.OpAllocate, &nodewire.Allocate{N: len(half), Ways: 1}).(*nodewire.Reservations); len(r.Res) == 0 {
		t.Fatal("nothing allocated")
	}
	if r := p.call(nodewire.OpPin, &nodewire.Pin{Chain: saved}).(*nodewire.PinResp); r.N != len(saved) {
		t.Fatalf("pinned %d", r.N)
	}
	st := v.Store().Stats()
	if st.Index.Pending == 0 || st.Map.ReservedBytes == 0 {
		t.Fatalf("before the close: %d pending, %d bytes reserved", st.Index.Pending, st.Map.ReservedBytes)
	}
	p.c.Close()
	waitLive(t, v, 1)
	st = v.Store().Stats()
	if st.Index.Pending != 0 || st.Map.ReservedBytes != 0 {
		t.Errorf("after the close: %d pending, %d bytes reserved", st.Index.Pending, st.Map.ReservedBytes)
	}
	if vs := v.Stats(); vs.ReleasedPins != 1 || vs.AbortedRuns == 0 || vs.AbortedBlocks == 0 {
		t.Errorf("service stats %+v", vs)
	}
	if n := a.Lookup(half); n != 0 {
		t.Errorf("the dead peer's save serves %d blocks", n)
	}
	// Its pin is gone: the prefix leaves at once when discarded.
	if n, err := a.Discard(saved[0]); err != nil || n != len(saved) {
		t.Errorf("discard: %d, %v", n, err)
	}
}

// TestServiceRefusesOutOfTurn: requests before hello, a commit of another
// connection's reservation, and a malformed frame are refused and close
// the connection.
func TestServiceRefusesOutOfTurn(t *testing.T) {
	g := tinyGeometry()
	v := startService(t, testConfig(t, g, kvshape.LayoutPerLayer, 64))
	defer v.Close()
	c, err := net.Dial("unix", v.Socket())
	if err != nil {
		t.Fatal(err)
	}
	e := nodewire.Enc{}
	(&nodewire.Lookup{Chain: []uint64{1}}).Encode(&e)
	if _, err := c.Write(nodewire.AppendFrame(nil, nodewire.OpLookup, 1, e.B)); err != nil {
		t.Fatal(err)
	}
	f, _, err := nodewire.ReadFrame(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, rerr, _ := nodewire.DecodeResponse(f.Op, f.Payload); !errors.Is(rerr, nodewire.ErrProtocol) {
		t.Errorf("lookup before hello: %v", rerr)
	}
	c.Close()
	p := dialRaw(t, v, g)
	e = nodewire.Enc{}
	(&nodewire.Commit{Reqs: []objmap.CommitRequest{{Res: objmap.Reservation{ID: 1, Chunks: 1}, Chain: []uint64{1}}}}).Encode(&e)
	p.c.Write(nodewire.AppendFrame(nil, nodewire.OpCommit, 9, e.B))
	f, _, err = nodewire.ReadFrame(p.c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, rerr, _ := nodewire.DecodeResponse(f.Op, f.Payload); !errors.Is(rerr, nodewire.ErrProtocol) {
		t.Errorf("commit of a reservation not held: %v", rerr)
	}
	p.c.Write([]byte{0xff, 0xff, 0xff, 0xff})
	waitLive(t, v, 0)
	if v.Stats().Refused < 2 {
		t.Errorf("refused %d", v.Stats().Refused)
	}
}

// TestServiceGPUPath: an engine on PathGPU (the GPU's restorer bound on the
// CPU, gputest) saves through the service what an engine on PathCPU
// restores, and restores what the other saved.
func TestServiceGPUPath(t *testing.T) {
	g := tinyGeometry()
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 64)
	v := startService(t, cfg)
	defer v.Close()
	gcfg := cfg
	bound := make(chan *gputest.Restorer, 1)
	gcfg.Path, gcfg.gpuBind = PathGPU, cpuGPU(nil, bound)
	gcfg.GPU.MaxPages = cfg.NumPages
	gs, gkv := connectKV(t, v, gcfg)
	defer closeKV(t, gs, gkv)
	cs, ckv := connectKV(t, v, cfg)
	defer closeKV(t, cs, ckv)
	rng := rand.New(rand.NewPCG(5, 6))
	for _, c := range []struct {
		name     string
		from, to *Store
		fkv, tkv *HostKV
	}{{"gpu to cpu", gs, cs, gkv, ckv}, {"cpu to gpu", cs, gs, ckv, gkv}} {
		chain := chainOf(uint64(c.name[0])<<32, 8)
		src := pageTable(rng, g, cfg.NumPages, len(chain))
		fill(c.fkv, g, chain, src)
		sv, err := c.from.Save(chain, src)
		if err != nil {
			t.Fatal(err)
		}
		sv.Wait()
		if sv.Saved() != len(chain) {
			t.Fatalf("%s: saved %d", c.name, sv.Saved())
		}
		dst := pageTable(rng, g, cfg.NumPages, len(chain))
		scramble(c.tkv, g, cfg.NumPages)
		l, err := c.to.Load(chain, dst)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Wait(); err != nil || l.Blocks() != len(chain) {
			t.Fatalf("%s: loaded %d: %v (%v)", c.name, l.Blocks(), err, l.Failure())
		}
		if err := verify(c.tkv, g, chain, dst, len(chain)); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
}

// TestConnectRefusesOtherGeometry: a connect with another KV shape fails
// with ErrGeometryMismatch, across the wire.
func TestConnectRefusesOtherGeometry(t *testing.T) {
	g := tinyGeometry()
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 64)
	v := startService(t, cfg)
	defer v.Close()
	other := cfg
	other.Geometry.Layers++
	other.Dirs, other.CapacityBytes = nil, 0
	if _, err := Connect(v.Socket(), other); !errors.Is(err, ErrGeometryMismatch) {
		t.Fatalf("connect with another geometry: %v", err)
	}
}

// TestServicePublishesOnce: the service's store publishes what every
// engine saved through it, once, with the tokens an engine gave; a
// connected store publishes nothing itself.
func TestServicePublishesOnce(t *testing.T) {
	g := tinyGeometry()
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 64)
	scfg := cfg
	scfg.KVEvents = &kvevents.Config{Engine: true}
	v := startService(t, scfg)
	defer v.Close()
	a, kva := connectKV(t, v, cfg)
	defer closeKV(t, a, kva)
	b, kvb := connectKV(t, v, cfg)
	defer closeKV(t, b, kvb)
	rng := rand.New(rand.NewPCG(7, 8))
	bt := g.ChunkPages * g.PageTokens
	for i, s := range []*Store{a, b} {
		chain := chainOf(uint64(i+1)<<40, 3)
		pages := pageTable(rng, g, cfg.NumPages, len(chain))
		meta := make([]BlockMeta, len(chain))
		for j := range meta {
			meta[j].Tokens = make([]uint32, bt)
			meta[j].Tokens[0] = uint32(i*100 + j)
		}
		sv, err := s.SaveWithMeta(chain, pages, meta)
		if err != nil {
			t.Fatal(err)
		}
		sv.Wait()
		if sv.Saved() != len(chain) {
			t.Fatalf("engine %d saved %d", i, sv.Saved())
		}
	}
	view := &engineView{held: map[uint64]bool{}}
	view.take(t, v.Store())
	if len(view.held) != 6 {
		t.Fatalf("the service published %d blocks, want the 6 both engines saved", len(view.held))
	}
	if st := v.Store().Stats().Events; st.HashOnlyBlocks != 0 {
		t.Errorf("%d blocks published without their tokens", st.HashOnlyBlocks)
	}
}
