package prefix

import (
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

func mustNew(t *testing.T, cfg Config) *Index {
	t.Helper()
	x, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// save reserves chain[from:] and commits what was reserved, with loc = id.
func save(t *testing.T, x *Index, chain []uint64, from int, size int64) Reservation {
	t.Helper()
	r, err := x.Reserve(chain, from, size)
	if err != nil {
		t.Fatal(err)
	}
	ids := chain[from : from+r.N]
	if _, err := x.Commit(ids, ids); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestNewConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg Config
		err error
	}{
		{Config{CapacityBytes: 1}, nil},
		{Config{CapacityBytes: 1, MaxBlocks: MaxBlocksLimit}, nil},
		{Config{CapacityBytes: MaxCapacityBytes}, nil},
		{Config{CapacityBytes: MaxCapacityBytes + 1}, ErrBadArg},
		{Config{CapacityBytes: 0}, ErrBadArg},
		{Config{CapacityBytes: -5}, ErrBadArg},
		{Config{CapacityBytes: 1, MaxBlocks: -1}, ErrBadArg},
		{Config{CapacityBytes: 1, MaxBlocks: MaxBlocksLimit + 1}, ErrBadArg},
	} {
		if _, err := New(tc.cfg); !errors.Is(err, tc.err) {
			t.Errorf("New(%+v) = %v, want %v", tc.cfg, err, tc.err)
		}
	}
}

func TestReserveStops(t *testing.T) {
	type step struct {
		chain []uint64
		from  int
		size  int64
	}
	for _, tc := range []struct {
		name        string
		cfg         Config
		setup       []step // saved (reserved and committed)
		pin         []uint64
		reserve     step
		wantN       int
		wantStop    StopReason
		wantEvicted []uint64
	}{
		{name: "all fit", cfg: Config{CapacityBytes: 1000},
			reserve: step{[]uint64{1, 2, 3}, 0, 100}, wantN: 3},
		{name: "from == len reserves nothing", cfg: Config{CapacityBytes: 1000},
			setup:   []step{{[]uint64{1, 2}, 0, 100}},
			reserve: step{[]uint64{1, 2}, 2, 100}, wantN: 0},
		{name: "prefix not cached", cfg: Config{CapacityBytes: 1000},
			setup:   []step{{[]uint64{1}, 0, 100}},
			reserve: step{[]uint64{1, 2, 3}, 2, 100}, wantStop: StopNotCached},
		{name: "prefix under another parent is not cached", cfg: Config{CapacityBytes: 1000},
			setup:   []step{{[]uint64{1, 2}, 0, 100}},
			reserve: step{[]uint64{2, 3}, 1, 100}, wantStop: StopNotCached},
		{name: "present", cfg: Config{CapacityBytes: 1000},
			setup:   []step{{[]uint64{1, 2}, 0, 100}},
			reserve: step{[]uint64{1, 2, 3}, 1, 100}, wantStop: StopPresent},
		{name: "partial by capacity, pinned hold the rest", cfg: Config{CapacityBytes: 500},
			setup: []step{{[]uint64{1, 2, 3}, 0, 100}}, pin: []uint64{1, 2, 3},
			reserve: step{[]uint64{1, 2, 3, 4, 5, 6}, 3, 100}, wantN: 2, wantStop: StopCapacity},
		{name: "evicts another branch, leaf first", cfg: Config{CapacityBytes: 500},
			setup:   []step{{[]uint64{1, 2, 3}, 0, 100}, {[]uint64{7, 8}, 0, 100}},
			reserve: step{[]uint64{7, 8, 9, 10}, 2, 100}, wantN: 2, wantEvicted: []uint64{3, 2}},
		{name: "own prefix is never evicted", cfg: Config{CapacityBytes: 300},
			setup:   []step{{[]uint64{1, 2}, 0, 100}},
			reserve: step{[]uint64{1, 2, 3, 4}, 2, 100}, wantN: 1, wantStop: StopCapacity},
		{name: "block larger than capacity", cfg: Config{CapacityBytes: 300},
			setup:   []step{{[]uint64{1}, 0, 100}},
			reserve: step{[]uint64{5}, 0, 301}, wantStop: StopCapacity},
		{name: "max blocks, evicting to make room", cfg: Config{CapacityBytes: 1 << 40, MaxBlocks: 3},
			setup:   []step{{[]uint64{1, 2, 3}, 0, 1}},
			reserve: step{[]uint64{5, 6}, 0, 1}, wantN: 2, wantEvicted: []uint64{3, 2}},
		{name: "max blocks held by pins", cfg: Config{CapacityBytes: 1 << 40, MaxBlocks: 3},
			setup: []step{{[]uint64{1, 2}, 0, 1}}, pin: []uint64{1, 2},
			reserve: step{[]uint64{5, 6}, 0, 1}, wantN: 1, wantStop: StopMaxBlocks},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := mustNew(t, tc.cfg)
			for _, s := range tc.setup {
				save(t, x, s.chain, s.from, s.size)
			}
			if tc.pin != nil && pinN(x, tc.pin) != len(tc.pin) {
				t.Fatal("pin failed")
			}
			r, err := x.Reserve(tc.reserve.chain, tc.reserve.from, tc.reserve.size)
			if err != nil {
				t.Fatal(err)
			}
			var ev []uint64
			for _, d := range r.Evicted {
				ev = append(ev, d.ID)
			}
			if r.N != tc.wantN || r.Stop != tc.wantStop || !slices.Equal(ev, tc.wantEvicted) {
				t.Errorf("got N=%d stop=%s evicted=%v, want N=%d stop=%s evicted=%v", r.N, r.Stop, ev, tc.wantN, tc.wantStop, tc.wantEvicted)
			}
			if err := x.Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestReserveErrors(t *testing.T) {
	x := mustNew(t, Config{CapacityBytes: 100})
	for _, tc := range []struct {
		chain []uint64
		from  int
		size  int64
	}{
		{[]uint64{1}, -1, 1}, {[]uint64{1}, 2, 1}, {[]uint64{1}, 0, 0}, {[]uint64{1}, 0, -1},
	} {
		if _, err := x.Reserve(tc.chain, tc.from, tc.size); !errors.Is(err, ErrBadArg) {
			t.Errorf("Reserve(%v, %d, %d) = %v, want ErrBadArg", tc.chain, tc.from, tc.size, err)
		}
	}
	if st := x.Stats(); st.Blocks != 0 {
		t.Errorf("errors changed the index: %+v", st)
	}
}

func TestCommitAbortErrors(t *testing.T) {
	x := mustNew(t, Config{CapacityBytes: 1000})
	save(t, x, []uint64{1}, 0, 10)
	if _, err := x.Reserve([]uint64{1, 2, 3}, 1, 10); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		ids  []uint64
		locs []uint64
		err  error
	}{
		{"length mismatch", []uint64{2}, nil, ErrBadArg},
		{"absent", []uint64{9}, []uint64{0}, ErrNotFound},
		{"resident", []uint64{1}, []uint64{0}, ErrNotPending},
		{"twice", []uint64{2, 2}, []uint64{0, 0}, ErrBadArg},
		{"child before its pending parent", []uint64{3}, []uint64{0}, ErrBadChain},
		{"reverse order", []uint64{3, 2}, []uint64{0, 0}, ErrBadChain},
	} {
		if _, err := x.Commit(tc.ids, tc.locs); !errors.Is(err, tc.err) {
			t.Errorf("commit %s: %v, want %v", tc.name, err, tc.err)
		}
	}
	for _, tc := range []struct {
		ids []uint64
		err error
	}{{[]uint64{9}, ErrNotFound}, {[]uint64{1}, ErrNotPending}, {[]uint64{3, 3}, ErrBadArg}} {
		if _, err := x.Abort(tc.ids); !errors.Is(err, tc.err) {
			t.Errorf("abort %v: %v, want %v", tc.ids, err, tc.err)
		}
	}
	if st := x.Stats(); st.Pending != 2 || st.Committed != 1 {
		t.Fatalf("errors changed the index: %+v", st)
	}
	// Aborting the first pending block cascades to its pending child.
	if _, err := x.Abort([]uint64{2}); err != nil {
		t.Fatal(err)
	}
	if st := x.Stats(); st.Pending != 0 || st.Aborted != 2 || st.Blocks != 1 {
		t.Fatalf("after abort: %+v", st)
	}
	if err := x.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestPinLimit(t *testing.T) {
	x := mustNew(t, Config{CapacityBytes: 1000})
	save(t, x, []uint64{1, 2, 3}, 0, 10)
	x.sl.at(x.find(2)).pins = MaxPins // as if MaxPins loads held it (and so its parent)
	x.sl.at(x.find(1)).pins = MaxPins
	x.nPinned = 2
	x.pinnedBytes = 20
	x.refresh(x.find(2))
	x.refresh(x.find(1))
	if n := pinN(x, []uint64{1, 2, 3}); n != 0 {
		t.Fatalf("pinned %d past the limit", n)
	}
	x.sl.at(x.find(1)).pins = MaxPins - 1
	if n := pinN(x, []uint64{1, 2, 3}); n != 1 {
		t.Fatalf("pinned %d, want 1 (block 2 at the limit)", n)
	}
}

// TestTableManyIDs exercises the hash table (growth, wrap-around, backward-shift deletion) with
// dense, strided and random ids against a Go map.
func TestTableManyIDs(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for name, gen := range map[string]func(i int) uint64{
		"dense":   func(i int) uint64 { return uint64(i) },
		"strided": func(i int) uint64 { return uint64(i) << 32 },
		"random":  func(int) uint64 { return rng.Uint64() },
	} {
		t.Run(name, func(t *testing.T) {
			const n = 100000
			x := mustNew(t, Config{CapacityBytes: 1 << 40})
			live := make(map[uint64]bool, n)
			ids := make([]uint64, 0, n)
			for i := 0; i < n; i++ {
				id := gen(i)
				if live[id] {
					continue
				}
				save(t, x, []uint64{id}, 0, 1)
				live[id] = true
				ids = append(ids, id)
				if i%3 == 2 { // remove a random live one
					j := rng.IntN(len(ids))
					if live[ids[j]] {
						if _, err := x.Remove(ids[j]); err != nil {
							t.Fatal(err)
						}
						live[ids[j]] = false
					}
				}
			}
			for _, id := range ids {
				if hit := x.Lookup([]uint64{id}) == 1; hit != live[id] {
					t.Fatalf("id %#x: hit %v, live %v", id, hit, live[id])
				}
			}
			if err := x.Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestConcurrent runs loaders and savers on one index from several goroutines (run with -race).
func TestConcurrent(t *testing.T) {
	x := mustNew(t, Config{CapacityBytes: 64 * 100})
	const workers, rounds = 6, 400
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := 0; i < rounds; i++ {
				// Chains over a shared tree: 4 roots, fan-out 3, depth ≤ 6.
				chain := make([]uint64, 1+rng.IntN(6))
				id := uint64(rng.IntN(4))
				for k := range chain {
					chain[k] = id
					id = id*3 + uint64(rng.IntN(3)) + 100
				}
				n := pinN(x, chain)
				r, err := x.Reserve(chain, n, 100)
				if err != nil {
					t.Error(err)
					return
				}
				ids := chain[n : n+r.N]
				if rng.IntN(4) == 0 {
					if _, err := x.Abort(ids); err != nil {
						t.Error(err)
					}
				} else if _, err := x.Commit(ids, ids); err != nil {
					t.Error(err)
				}
				if _, err := x.Unpin(chain[:n]); err != nil {
					t.Error(err)
				}
				if rng.IntN(50) == 0 {
					x.Remove(chain[0]) //nolint:errcheck // may be gone already
				}
			}
		}(w)
	}
	wg.Wait()
	if err := x.Check(); err != nil {
		t.Fatal(err)
	}
	if st := x.Stats(); st.Pinned != 0 || st.Pending != 0 || st.Draining != 0 || st.Bytes > st.CapacityBytes {
		t.Fatalf("after all loads and saves: %+v", st)
	}
}

func TestStrings(t *testing.T) {
	for s, want := range map[State]string{StateAbsent: "absent", StatePending: "pending", StateResident: "resident", StatePinned: "pinned"} {
		if s.String() != want {
			t.Errorf("%d: %s", s, s)
		}
	}
	for r, want := range map[StopReason]string{StopNone: "none", StopPresent: "present", StopNotCached: "not-cached",
		StopCapacity: "capacity", StopMaxBlocks: "max-blocks", 99: "StopReason(99)"} {
		if r.String() != want {
			t.Errorf("%d: %s", r, r)
		}
	}
}

// pinN pins and returns only the count.
func pinN(x *Index, chain []uint64) int {
	n, _ := x.Pin(chain, nil)
	return n
}

func TestPinLocations(t *testing.T) {
	x := mustNew(t, Config{CapacityBytes: 1000})
	save(t, x, []uint64{1, 2, 3}, 0, 10) // loc = id
	n, locs := x.Pin([]uint64{1, 2, 3, 4}, []uint64{99})
	if n != 3 || !slices.Equal(locs, []uint64{99, 1, 2, 3}) {
		t.Fatalf("Pin = %d %v", n, locs)
	}
}

func TestSubtree(t *testing.T) {
	x, err := New(Config{CapacityBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	chain := []uint64{1, 2, 3}
	if _, err := x.Reserve(chain, 0, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Commit(chain[:2], []uint64{10, 20}); err != nil {
		t.Fatal(err)
	}
	got := x.Subtree(2, nil)
	if len(got) != 2 || got[0].ID != 2 || got[0].State != StateResident || got[0].Parent != 1 ||
		got[1].ID != 3 || got[1].State != StatePending || !got[1].HasParent {
		t.Fatalf("Subtree(2) = %+v", got)
	}
	if got := x.Subtree(99, nil); len(got) != 0 {
		t.Fatalf("Subtree of an absent id = %+v", got)
	}
}
