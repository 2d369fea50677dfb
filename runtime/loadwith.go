package runtime

import (
	"fmt"
	"sync"
	"time"
)

// LoadOptions are what an engine that schedules ahead of its loads (vLLM)
// tells a Load beyond the chain and its block table.
type LoadOptions struct {
	// Skip is how many leading blocks of the chain the engine already has
	// (its local prefix-cache hits): they are not restored, their pages are
	// not touched, and the block table covers chain[Skip:] only.
	Skip int
	// Promised: the engine already counted these blocks as computed (Match
	// said so), so the planner does not trade any of them for recompute: it
	// loads every cached block it can admit. A promised block not restored
	// is a load error for the engine, where an unpromised one is a recompute.
	Promised bool
}

// promisedReadyNs is a compute start far enough ahead that every finish time
// the planner compares is dominated by compute: it then loads every block it
// admits (each loaded block shortens the compute that follows).
const promisedReadyNs = int64(1) << 40

func (o LoadOptions) computeReadyNs() int64 {
	if o.Promised {
		return promisedReadyNs
	}
	return 0
}

// resolveAfter maps the pinned blocks after the skipped ones to runs, their
// chain positions counted from skip (the block table's first block).
func (s *Store) resolveAfter(chain, locs []uint64, pinned, skip int, miss *[numMissCauses]int64) []loadRun {
	if pinned <= skip {
		return nil
	}
	return s.resolve(chain[skip:pinned], locs[skip:pinned], miss)
}

// MaxHolds bounds the holds live at once in one store: each pins a prefix,
// which eviction cannot free.
const MaxHolds = 1 << 16

// Hold is a prefix the engine's scheduler was promised by Match: its blocks
// stay in the index (pinned, so neither eviction nor a save's discard can
// drop them) until Release, or until the hold's time to live ran out, so
// that a worker that dies or a request that is dropped without a release
// cannot pin storage forever.
type Hold struct {
	s      *Store
	chain  []uint64 // chain[:pinned] is pinned while the hold lives
	pinned int
	blocks int // blocks after skip that a promised load restores
	once   sync.Once
	timer  *time.Timer
}

// Blocks is what Match promised: blocks after the skipped ones that a
// promised LoadWith of the same chain restores unless a read fails.
func (h *Hold) Blocks() int { return h.blocks }

// Match is the lookup of an engine that commits to a hit before it loads
// (vLLM's get_num_new_matched_tokens): it returns how many blocks after the
// first skip a promised load of chain restores, and holds them for ttl.
// Left out of the count, as blocks to compute rather than errors: blocks not
// cached, blocks the planner would rather recompute (it is asked as for a
// load now, nothing is read), and on PathGPU blocks past what one GPU
// restore takes (GPUMaxPages, GPUMaxRuns). The caller must Release the hold
// once the load started (the load pins for itself) or was dropped.
func (s *Store) Match(chain []uint64, skip int, ttl time.Duration) (*Hold, error) {
	if skip < 0 || skip > len(chain) {
		return nil, fmt.Errorf("runtime: match: skip %d of a %d-block chain: %w", skip, len(chain), ErrBadRequest)
	}
	if ttl <= 0 {
		return nil, fmt.Errorf("runtime: match: ttl %v, want > 0: %w", ttl, ErrBadRequest)
	}
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.endOp()
	s.mu.Lock()
	if s.holds >= MaxHolds {
		s.mu.Unlock()
		return nil, fmt.Errorf("runtime: match: %d holds live: %w", MaxHolds, ErrBusy)
	}
	s.holds++
	s.mu.Unlock()
	h := &Hold{s: s, chain: append([]uint64(nil), chain...)}
	var locs []uint64
	var miss [numMissCauses]int64
	h.pinned, locs = s.idx.Pin(h.chain, nil)
	runs := s.resolveAfter(h.chain, locs, h.pinned, skip, &miss)
	h.blocks = s.matchBlocks(runs, len(chain)-skip)
	s.stats.lookups.Add(1)
	s.stats.lookupBlocks.Add(int64(len(chain) - skip))
	s.stats.hitBlocks.Add(int64(h.blocks))
	h.timer = time.AfterFunc(ttl, func() { h.release(true) })
	return h, nil
}

// matchBlocks is how many leading blocks of runs a load would restore: on
// PathGPU cut first to what one GPU restore takes (as LoadWith cuts it),
// then the planner's split, asked and withdrawn under the scheduler's lock
// (so no read of it is dispatched).
func (s *Store) matchBlocks(runs []loadRun, blocks int) int {
	cached := 0
	for _, r := range runs {
		cached += r.k
	}
	if cached == 0 {
		return 0
	}
	if s.cfg.Path == PathGPU {
		runs = keepBlocks(runs, s.gpuCut(runs, cached))
	}
	req := s.loadRequest(runs, blocks)
	req.SegmentsOnly, req.QueueUnknown = true, true // as LoadWith plans an unpromised load
	plan, err := s.sched.AskLoad(req)
	if err != nil {
		return 0 // a request the planner refuses is one LoadWith would refuse: no hit
	}
	s.maybeReprobe(runs, plan)
	return plan.LoadBlocks
}

// Release ends the hold (idempotent; the timer's expiry is a release too).
func (h *Hold) Release() { h.release(false) }

// release unpins once; expired: the time to live ran out (the timer's
// goroutine; the timer is not stopped, it has fired).
func (h *Hold) release(expired bool) {
	h.once.Do(func() {
		s := h.s
		if expired {
			s.holdsExpired.Add(1)
		} else {
			h.timer.Stop()
		}
		s.mu.Lock()
		s.holds--
		s.mu.Unlock()
		if h.pinned == 0 || s.begin() != nil {
			return // closing: the index goes with the store
		}
		defer s.endOp()
		dropped, err := s.idx.Unpin(h.chain[:h.pinned])
		if err != nil {
			panic(fmt.Sprintf("runtime: unpinning a hold: %v", err)) // pins are taken and released in pairs
		}
		s.cat.Release(dropped)
	})
}
