package runtime

import (
	"sync"
	"time"

	"github.com/tutti-io/tutti/runtime/internal/mover"
)

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
	pin    *pinned
	blocks int // blocks after skip that a promised load restores
	once   sync.Once
	timer  *time.Timer
}

// Blocks is what Match promised: blocks after the skipped ones that a
// promised LoadWith of the same chain restores unless a read fails.
func (h *Hold) Blocks() int { return h.blocks }

// Release ends the hold (idempotent; the timer's expiry is a release too).
func (h *Hold) Release() { h.release(false) }

// hold pins chain for Match (a hold was counted) and counts the lookup.
func (s *Store) hold(chain []uint64, skip int, ttl time.Duration) *Hold {
	h := &Hold{s: s, chain: append([]uint64(nil), chain...)}
	var miss [numMissCauses]int64
	h.pin = s.ctl.pin(h.chain, skip, &miss)
	h.pinned = h.pin.n
	h.blocks = s.matchBlocks(h.pin.runs, len(chain)-skip)
	s.stats.lookups.Add(1)
	s.stats.lookupBlocks.Add(int64(len(chain) - skip))
	s.stats.hitBlocks.Add(int64(h.blocks))
	h.timer = time.AfterFunc(ttl, func() { h.release(true) })
	return h
}

// matchBlocks is how many leading blocks of runs a load would restore: cut
// first to what one restore of the mover takes (as LoadWith cuts it), then
// the planner's split, asked and withdrawn (iosched.AskLoad: no read of it
// is dispatched).
func (s *Store) matchBlocks(runs []mover.Run, blocks int) int {
	cached := 0
	for _, r := range runs {
		cached += r.K
	}
	if cached == 0 {
		return 0
	}
	runs = keepBlocks(runs, s.mv.Cut(runs, cached))
	req := s.loadRequest(runs, blocks)
	req.SegmentsOnly, req.QueueUnknown = true, true // as LoadWith plans an unpromised load
	plan, err := s.sched.AskLoad(req)
	if err != nil {
		return 0 // a request the planner refuses is one LoadWith would refuse: no hit
	}
	s.maybeReprobe(runs, plan)
	return plan.LoadBlocks
}

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
		s.ctl.unpin(h.pin)
	})
}
