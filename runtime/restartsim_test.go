package runtime

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/uring/uringsim"
)

// The restart simulation: seeded runs of saves, lookups, loads, discards
// and evictions (a pool that holds a few runs) on one store, with
// clean Close-and-reopens and crashes at chosen journal writes
// (objmap.Map.SimulateCrash: before the next group, inside it, or with it
// whole on disk but not acknowledged) followed by a reopen. It checks the
// rule of runtime/internal/catalog (recover.go):
//
//   - after a clean Close the reopened index is the index before Close (the
//     same blocks under the same parents) in the same eviction order;
//   - after a crash every block that was served at the crash is served, and
//     any other block served is one whose drop (eviction, discard) the
//     journal had not made durable, or one of the save the crash cut;
//   - whatever a load restores is bit-exact (nothing half-written served).
//
// TUTTI_RESTART_SEEDS=N runs N seeds (default 2000, 100 with -short);
// TUTTI_RESTART_SEED=K reruns seed K alone, logging every step.

// simGeometry has chunks large against the run headers, so both the
// index's capacity and the pool's space end saves.
func simGeometry() kvshape.Geometry {
	return kvshape.Geometry{Layers: 2, KVHeads: 2, HeadDim: 32, DType: kvshape.BF16, Planes: 2, PageTokens: 8, ChunkPages: 1}
}

// restartTotals sums what the seeds did, for the test log (and BENCHMARKS.md).
type restartTotals struct {
	seeds, ops, saves, drops, closes, crashes, lost, returned int
}

func TestRestartSim(t *testing.T) {
	seeds, verbose := restartSeeds(t)
	var mu sync.Mutex
	var tot restartTotals
	// The seeds run in parallel (each its own store): they are
	// independent, and most of a seed's time is its Opens.
	t.Run("seeds", func(t *testing.T) {
		for _, seed := range seeds {
			t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
				t.Parallel()
				t.Cleanup(func() {
					if t.Failed() {
						t.Logf("rerun: TUTTI_RESTART_SEED=%d go test -race -run TestRestartSim ./runtime", seed)
					}
				})
				var one restartTotals
				restartOnce(t, seed, verbose, &one)
				mu.Lock()
				tot.add(one)
				mu.Unlock()
			})
		}
	})
	t.Logf("%d seeds, %d ops (%d saves committing blocks, %d blocks dropped), %d clean reopens, %d crashes: %d committed blocks lost, %d dropped blocks back after a crash",
		tot.seeds, tot.ops, tot.saves, tot.drops, tot.closes, tot.crashes, tot.lost, tot.returned)
}

func (a *restartTotals) add(b restartTotals) {
	a.seeds += b.seeds
	a.ops += b.ops
	a.saves += b.saves
	a.drops += b.drops
	a.closes += b.closes
	a.crashes += b.crashes
	a.lost += b.lost
	a.returned += b.returned
}

func restartSeeds(t *testing.T) (seeds []uint64, verbose bool) {
	if s := os.Getenv("TUTTI_RESTART_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return []uint64{v}, true
	}
	n := 2000
	if testing.Short() {
		n = 100
	}
	if s := os.Getenv("TUTTI_RESTART_SEEDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("TUTTI_RESTART_SEEDS=%q: want a count", s)
		}
		n = v
	}
	for i := range n {
		seeds = append(seeds, uint64(i+1))
	}
	return seeds, false
}

// simDir is a directory for one seed's store: on tmpfs where there is one
// (the pool is buffered), so that thousands of stores cost no disk syncs.
func simDir(t *testing.T) string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "tutti-restart-")
		if err == nil {
			t.Cleanup(func() { os.RemoveAll(d) })
			return d
		}
	}
	return t.TempDir()
}

// restartSim is one seed's store and what the test knows of it.
type restartSim struct {
	t       *testing.T
	rng     *rand.Rand
	cfg     Config
	s       *Store
	kv      *HostKV
	chains  [][]uint64
	parent  map[uint64]uint64 // every id's parent (ids name their prefix)
	dropped map[uint64]bool   // blocks that left the index; true once the journal holds it
	verbose bool
	tot     *restartTotals
}

func restartOnce(t *testing.T, seed uint64, verbose bool, tot *restartTotals) {
	rng := rand.New(rand.NewPCG(seed, 0x43))
	g := simGeometry()
	cfg := Config{probe: fixedProbe(defaultDevice.WriteBytesPerSec, defaultDevice.ReadBytesPerSec),
		Dirs: []string{simDir(t)}, CapacityBytes: []int64{96 << 10, 160 << 10, 256 << 10}[rng.IntN(3)],
		Geometry: g, Layout: kvshape.LayoutPerLayer, NumPages: 16, StagingBytes: 64 << 10, StagingSlotBytes: 8 << 10,
		QueueDepth: 16, NoPrewrite: true, buffered: true}
	var sim *uringsim.Sim
	cfg = simConfig(cfg, seed, &sim)
	r := &restartSim{t: t, rng: rng, cfg: cfg, parent: map[uint64]uint64{}, dropped: map[uint64]bool{}, verbose: verbose, tot: tot}
	for f := range 2 + rng.IntN(5) {
		for range 1 + rng.IntN(4) {
			c := make([]uint64, 1+rng.IntN(8))
			prev := uint64(f + 1)
			for i := range c {
				c[i] = prev*1000003 + uint64(rng.IntN(2)) + 1
				if i > 0 {
					r.parent[c[i]] = prev
				}
				prev = c[i]
			}
			r.chains = append(r.chains, c)
		}
	}
	r.s, r.kv = openKV(t, cfg)
	defer func() { closeKV(t, r.s, r.kv) }()
	tot.seeds++
	// Two rounds of operations, each ended by a clean Close or a crash
	// and a reopen (an Open costs most of a seed's time).
	for range 2 {
		for i, ops := 0, 4+rng.IntN(12); i < ops; i++ {
			tot.ops++
			switch p := rng.IntN(100); {
			case p < 50:
				r.save(r.chains[rng.IntN(len(r.chains))])
			case p < 62:
				r.s.Lookup(r.chains[rng.IntN(len(r.chains))])
			case p < 72:
				r.load(r.chains[rng.IntN(len(r.chains))])
			case p < 92:
				r.discard()
			default:
				if err := r.s.m.Sync(); err != nil {
					t.Fatal(err)
				}
				r.durable()
			}
		}
		if rng.IntN(2) == 0 {
			r.reopenClean()
		} else {
			r.crash()
		}
	}
}

func (r *restartSim) logf(format string, args ...any) {
	if r.verbose {
		r.t.Logf(format, args...)
	}
}

// step runs op and notes the blocks that left the index meanwhile
// (journaled, not yet durable) or came into it.
func (r *restartSim) step(op func()) {
	before := residentSet(r.s)
	op()
	after := residentSet(r.s)
	for b := range before {
		if !after[b] {
			r.dropped[b.ID] = false
			r.tot.drops++
		}
	}
	for b := range after {
		delete(r.dropped, b.ID)
	}
}

// durable notes that a journal group was written: every drop before it is
// durable.
func (r *restartSim) durable() {
	for id := range r.dropped {
		r.dropped[id] = true
	}
}

func (r *restartSim) save(chain []uint64) *Save {
	var sv *Save
	r.step(func() {
		pages := pageTable(r.rng, r.cfg.Geometry, r.cfg.NumPages, len(chain))
		fill(r.kv, r.cfg.Geometry, chain, pages)
		sv = saveWait(r.t, r.s, chain, pages)
	})
	if sv.Saved() > 0 { // its commit's group carried the drops before it
		r.durable()
		r.tot.saves++
	}
	r.logf("save %x: saved %d, skipped cached %d no-space %d io %d", chain, sv.Saved(), sv.Skipped(SkipCached), sv.Skipped(SkipNoSpace), sv.Skipped(SkipIOError))
	return sv
}

// load restores chain and checks every block it restored, bit for bit.
func (r *restartSim) load(chain []uint64) {
	g := r.cfg.Geometry
	pages := pageTable(r.rng, g, r.cfg.NumPages, len(chain))
	scramble(r.kv, g, r.cfg.NumPages)
	l := loadWait(r.t, r.s, chain, pages)
	if err := verify(r.kv, g, chain, pages, l.Blocks()); err != nil {
		r.t.Fatalf("load of %x served wrong data: %v", chain, err)
	}
}

func (r *restartSim) discard() {
	res := r.s.ResidentBlocks()
	if len(res) == 0 {
		return
	}
	id := res[r.rng.IntN(len(res))].ID
	r.step(func() {
		if _, err := r.s.Discard(id); err != nil {
			r.t.Fatal(err)
		}
	})
	r.logf("discard %x", id)
}

// reopenClean closes the store and reopens it: the index and its eviction
// order must be what they were.
func (r *restartSim) reopenClean() {
	t := r.t
	if err := r.s.WaitSaves(); err != nil && !errors.Is(err, ErrSavesFailed) {
		t.Fatal(err)
	}
	want, wantLRU := residentSet(r.s), r.s.idx.LRU()
	if err := r.s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	r.reopen()
	got := residentSet(r.s)
	for b := range want {
		if !got[b] {
			t.Fatalf("block %+v served before a clean Close, not after it (recovery %+v)", b, r.s.Recovery())
		}
	}
	for b := range got {
		if !want[b] {
			t.Fatalf("block %+v served after a clean Close, not before it (recovery %+v)", b, r.s.Recovery())
		}
	}
	if lru := r.s.idx.LRU(); !slices.Equal(lru, wantLRU) {
		t.Fatalf("eviction order after a clean Close\n%x\nbefore it\n%x", lru, wantLRU)
	}
	if rep := r.s.Recovery(); rep.DroppedRuns != 0 || rep.DuplicateBlocks != 0 || rep.EvictedAtOpen != 0 {
		t.Fatalf("recovery after a clean Close: %+v", rep)
	}
	r.tot.closes++
	r.logf("clean reopen: %d blocks", len(got))
}

// crash kills the store at a journal write chosen by the seed (before or
// after one more save), then reopens it.
func (r *restartSim) crash() {
	t := r.t
	after := r.rng.IntN(3) - 1 // -1: now; 0: the next group; 1: the one after
	tears := []func(int) int{
		func(int) int { return 0 },
		func(n int) int { return r.rng.IntN(n + 1) },
		func(n int) int { return n },
	}
	tear := tears[r.rng.IntN(len(tears))]
	r.s.m.SimulateCrash(after, tear)
	var cut []uint64 // the save the crash may cut
	if after >= 0 {
		cut = r.chains[r.rng.IntN(len(r.chains))]
		r.save(cut)
	}
	must := residentSet(r.s) // served at the crash: all durably committed
	_ = r.s.Close()          // fails: the journal is dead
	r.reopen()
	got := residentSet(r.s)
	for b := range must {
		if !got[b] {
			r.tot.lost++
			t.Fatalf("block %+v served at the crash, lost after it (recovery %+v)", b, r.s.Recovery())
		}
	}
	for b := range got {
		if must[b] {
			continue
		}
		durable, wasDropped := r.dropped[b.ID]
		switch {
		case wasDropped && !durable:
			r.tot.returned++
		case slices.Contains(cut, b.ID):
		default:
			t.Fatalf("block %+v served after the crash: not served at it, and its drop was durable (%v) or it never was (recovery %+v)",
				b, wasDropped, r.s.Recovery())
		}
		if p, ok := r.parent[b.ID]; b.HasParent != ok || b.Parent != p {
			t.Fatalf("block %+v served under the wrong parent (%#x)", b, p)
		}
	}
	// What the reopened store serves is now what the journal holds.
	clear(r.dropped)
	for _, c := range r.chains {
		r.load(c)
	}
	r.tot.crashes++
	r.logf("crash (after %d groups): %d served at it, %d after", after, len(must), len(got))
}

func (r *restartSim) reopen() {
	if err := r.kv.Free(); err != nil {
		r.t.Fatal(err)
	}
	r.s, r.kv = openKV(r.t, r.cfg)
	if err := r.s.idx.Check(); err != nil {
		r.t.Fatalf("index after reopen: %v", err)
	}
}
