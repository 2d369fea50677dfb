package runtime

import (
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
)

// benchGeometry is a block of 512 KiB (eval/model's tiny shape): a load of
// 16 blocks moves 8 MiB.
func benchGeometry() kvshape.Geometry {
	return kvshape.Geometry{Layers: 2, KVHeads: 2, HeadDim: 64, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 32}
}

// benchStores is an opened store and one connected to a service over
// another store of the same config: the same data path, the control path
// local or over the socket.
func benchStores(b *testing.B, blocks int) (local, connected *Store, kvl, kvc *HostKV) {
	g := benchGeometry()
	cfg := testConfig(b, g, kvshape.LayoutPerLayer, blocks*g.ChunkPages)
	cfg.CapacityBytes = CapacityForBlocks(g, 64*blocks)
	cfg.StagingBytes, cfg.StagingSlotBytes = 16<<20, 1<<20
	local, kvl = openKV(b, cfg)
	scfg := cfg
	scfg.Dirs = []string{b.TempDir(), b.TempDir()}
	v, err := Serve(scfg, filepath.Join(b.TempDir(), "s.sock"))
	if err != nil {
		b.Fatal(err)
	}
	ccfg := cfg
	ccfg.Dirs, ccfg.CapacityBytes = nil, 0
	connected, err = Connect(v.Socket(), ccfg)
	if err != nil {
		b.Fatal(err)
	}
	kvc, err = AllocHostKV(g, cfg.Layout, cfg.NumPages)
	if err != nil {
		b.Fatal(err)
	}
	if err := connected.RegisterKV(kvc.Memory()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		closeKV(b, local, kvl)
		closeKV(b, connected, kvc)
		_ = v.Close()
	})
	return local, connected, kvl, kvc
}

// BenchmarkServiceLoad is a 16-block (8 MiB) load through an opened store
// and through a connected one: the difference is the control path's cost
// per Load (a pin and an unpin over the socket).
func BenchmarkServiceLoad(b *testing.B) {
	const blocks = 16
	local, connected, kvl, kvc := benchStores(b, blocks)
	g := benchGeometry()
	chain := chainOf(0x10ad, blocks)
	pages := pageTable(rand.New(rand.NewPCG(1, 1)), g, blocks*g.ChunkPages, blocks)
	for _, c := range []struct {
		name string
		s    *Store
		kv   *HostKV
	}{{"opened", local, kvl}, {"connected", connected, kvc}} {
		fill(c.kv, g, chain, pages)
		sv, err := c.s.Save(chain, pages)
		if err != nil {
			b.Fatal(err)
		}
		sv.Wait()
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(blocks) * g.ChunkBytes())
			for b.Loop() {
				l, err := c.s.Load(chain, pages)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Wait(); err != nil || l.Blocks() != blocks {
					b.Fatalf("loaded %d: %v", l.Blocks(), err)
				}
			}
		})
	}
}

// BenchmarkServiceSave is a 4-block (2 MiB) save of a new prefix, waited
// for and discarded, through an opened and a connected store: the
// difference is the control path's cost per Save (lookup, reserve,
// allocate, commit over the socket).
func BenchmarkServiceSave(b *testing.B) {
	const blocks = 4
	local, connected, kvl, kvc := benchStores(b, blocks)
	g := benchGeometry()
	pages := pageTable(rand.New(rand.NewPCG(1, 1)), g, blocks*g.ChunkPages, blocks)
	for _, c := range []struct {
		name string
		s    *Store
		kv   *HostKV
	}{{"opened", local, kvl}, {"connected", connected, kvc}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(blocks) * g.ChunkBytes())
			i := uint64(0)
			for b.Loop() {
				i++
				chain := chainOf(i<<20, blocks)
				sv, err := c.s.Save(chain, pages)
				if err != nil {
					b.Fatal(err)
				}
				sv.Wait()
				if sv.Saved() != blocks {
					b.Fatalf("saved %d of %d", sv.Saved(), blocks)
				}
				if _, err := c.s.Discard(chain[0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkServiceControl is the control calls alone, over the socket: a
// load's (pin and unpin of 16 blocks), a save's but its commit, a lookup.
func BenchmarkServiceControl(b *testing.B) {
	const blocks = 16
	_, connected, _, kvc := benchStores(b, blocks)
	g := benchGeometry()
	chain := chainOf(0xc0, blocks)
	pages := pageTable(rand.New(rand.NewPCG(1, 1)), g, blocks*g.ChunkPages, blocks)
	fill(kvc, g, chain, pages)
	sv, err := connected.Save(chain, pages)
	if err != nil {
		b.Fatal(err)
	}
	sv.Wait()
	b.Run("pin-unpin", func(b *testing.B) {
		var miss [numMissCauses]int64
		for b.Loop() {
			p := connected.ctl.pin(chain, 0, &miss)
			if p.n != blocks {
				b.Fatalf("pinned %d", p.n)
			}
			connected.ctl.unpin(p)
		}
	})
	// A save's control steps but its commit (whose syncs and journal write
	// are the store's, wherever it runs): reserve (with its lookup),
	// allocate, and giving both back.
	b.Run("save-steps", func(b *testing.B) {
		ctl := connected.ctl
		i := uint64(0)
		for b.Loop() {
			i++
			c := chainOf(i<<24, 4)
			from, n, _, err := ctl.Reserve(c, nil, nil)
			if err != nil || from != 0 || n != len(c) {
				b.Fatalf("reserved %d: %v", n, err)
			}
			res, err := ctl.Allocate(n, 1)
			if err != nil || len(res) != 1 {
				b.Fatalf("allocated %d runs: %v", len(res), err)
			}
			if err := ctl.Abort(res[0]); err != nil {
				b.Fatal(err)
			}
			if err := ctl.Unreserve(c); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("lookup", func(b *testing.B) {
		for b.Loop() {
			if connected.Lookup(chain) != blocks {
				b.Fatal("miss")
			}
		}
	})
}
