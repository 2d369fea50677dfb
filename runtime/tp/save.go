package tp

import (
	"errors"
	"fmt"

	"github.com/tutti-io/tutti/runtime"
)

// Save is one group save: every rank saves its shard of the same blocks
// from the same block table. Done is closed once every rank's save ended and
// the group committed (or discarded) what they stored; then Saved, Resident
// and Failed are final.
type Save struct {
	g        *Group
	chain    []uint64
	saves    []*runtime.Save
	gathered chan struct{}
	done     chan struct{}

	// Final after done.
	committed, resident, discarded int
	failures                       []error
}

// Gathered is closed once no rank reads the engine's pages for this save.
func (sv *Save) Gathered() <-chan struct{} { return sv.gathered }

// Done is closed when the save ended on every rank and was reconciled.
func (sv *Save) Done() <-chan struct{} { return sv.done }

// Wait blocks until Done.
func (sv *Save) Wait() { <-sv.done }

// Saved is the number of blocks this save added to the group index
// (committed on every rank); final after Done.
func (sv *Save) Saved() int { return sv.committed }

// Resident is the number of leading chain blocks resident on every rank
// when the save ended (what was cached before plus what it added); final
// after Done.
func (sv *Save) Resident() int { return sv.resident }

// Discarded is the number of blocks discarded on ranks that had committed
// what another rank failed (summed over ranks); final after Done.
func (sv *Save) Discarded() int { return sv.discarded }

// Failed returns nil when no rank failed a block of this save, else one
// error per failing rank naming the rank and its skip causes; final after
// Done. Blocks skipped as already cached (or being saved by another save)
// are not failures.
func (sv *Save) Failed() error { return errors.Join(sv.failures...) }

// Rank returns rank r's save (its own Saved and Skipped counts).
func (sv *Save) Rank(r int) *runtime.Save { return sv.saves[r] }

// Save stores the blocks of chain the ranks do not have yet, each rank its
// shard from its own KV memory at the same pages (pages[i*ChunkPages+j] is
// page j of chain block i, as for runtime.Store.Save). It returns at once;
// the pages must stay unchanged until Gathered. When every rank's save
// ended, the leading blocks resident on every rank go into the group index;
// if any rank skipped a block for a failure (an I/O error, ENOSPC, no space,
// the save budget, closing), the blocks past the group's resident prefix
// are discarded on the ranks that committed them, so nothing is left
// committed on some ranks only (counted in Stats.FailedSaves,
// Stats.DiscardedBlocks). If a rank refuses the save at once (its error is
// returned, naming the rank), Save returns after the other ranks' saves
// ended and were reconciled the same way, so the pages are free again.
func (g *Group) Save(chain []uint64, pages []int32) (*Save, error) {
	if err := g.begin(); err != nil {
		return nil, err
	}
	g.mu.Lock()
	g.savesLive++
	g.mu.Unlock()
	g.stats.saves.Add(1)
	sv := &Save{g: g, chain: chain, saves: make([]*runtime.Save, len(g.ranks)),
		gathered: make(chan struct{}), done: make(chan struct{})}
	errs := eachRank(len(g.ranks), func(r int) (err error) {
		if sv.saves[r], err = g.ranks[r].Save(chain, pages); err != nil {
			return fmt.Errorf("tp: rank %d: %w", r, err)
		}
		return nil
	})
	refused := errors.Join(errs...)
	go sv.finish(errs)
	if refused != nil {
		<-sv.done
		return nil, refused
	}
	return sv, nil
}

// finish waits for every rank's save, then reconciles: discard on failure,
// group commit of what every rank has.
func (sv *Save) finish(refused []error) {
	g := sv.g
	for _, rs := range sv.saves {
		if rs != nil {
			<-rs.Gathered()
		}
	}
	close(sv.gathered)
	causes := runtime.SkipCauses()
	for r, rs := range sv.saves {
		if rs == nil {
			sv.failures = append(sv.failures, refused[r])
			continue
		}
		rs.Wait()
		var why []string
		for _, c := range causes {
			if c == runtime.SkipCached {
				continue
			}
			if n := rs.Skipped(c); n > 0 {
				why = append(why, fmt.Sprintf("%d blocks %v", n, c))
				g.stats.failedRank[c].Add(1)
			}
		}
		if why != nil {
			sv.failures = append(sv.failures, fmt.Errorf("tp: rank %d skipped %v", r, why))
		}
	}
	have := make([]int, len(g.ranks))
	k := len(sv.chain)
	for r, s := range g.ranks {
		have[r] = s.Resident(sv.chain)
		k = min(k, have[r])
	}
	if len(sv.failures) > 0 {
		g.stats.failedSaves.Add(1)
		// Another rank failed chain[k]: what the others committed from
		// there on is never a group hit; free it now rather than wait for
		// eviction. A concurrent save may have committed some of it; it
		// is a miss for that one as well, which is safe.
		for r, s := range g.ranks {
			if have[r] <= k {
				continue
			}
			if _, err := s.Discard(sv.chain[k]); err == nil {
				sv.discarded += have[r] - k
			}
		}
		g.stats.discarded.Add(int64(sv.discarded))
	}
	if k > 0 {
		// Only bad arguments fail here, which k excludes.
		if before, after, err := g.indexPath(sv.chain[:k]); err == nil {
			sv.committed = after - before
		}
	}
	sv.resident = k
	g.stats.committed.Add(int64(sv.committed))
	close(sv.done)
	g.mu.Lock()
	g.savesLive--
	g.mu.Unlock()
	g.savesCond.Broadcast()
	g.ops.Done()
}
