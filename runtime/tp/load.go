package tp

import (
	"errors"
	"fmt"

	"github.com/tutti-io/tutti/runtime"
)

// Load is one group restore: every rank restores its shard of the same
// blocks into its own KV memory, concurrently. WaitLayer(l) returns once
// every rank has layer l; Blocks is the number of leading chain blocks
// restored on every rank (final after Wait). Pages past Blocks hold
// unspecified bytes on some rank: the engine recomputes them on all.
type Load struct {
	hit   int // group hit at Load: no rank's blocks past it count
	loads []*runtime.Load
	done  chan struct{}
}

// Load restores the group's resident prefix of chain (Lookup's answer at
// the call) into every rank's pages of the block table (the same page ids on
// every rank) and returns at once; each rank's reads run in the background,
// all ranks at the same time. Each rank plans its load (load vs recompute)
// on the whole chain as a single store would; a rank may restore blocks past
// the group hit (when it has more than another rank), which Blocks never
// counts. If a rank refuses the load (ErrBusy, ...), Load waits for the
// loads it started on the other ranks, so that nothing writes the pages
// after it returns, and returns the error naming the rank.
func (g *Group) Load(chain []uint64, pages []int32) (*Load, error) {
	if err := g.begin(); err != nil {
		return nil, err
	}
	g.stats.loads.Add(1)
	l := &Load{hit: g.lookup(chain), loads: make([]*runtime.Load, len(g.ranks)), done: make(chan struct{})}
	g.stats.loadHits.Add(int64(l.hit))
	if l.hit == 0 {
		// Nothing on every rank: no rank reads anything.
		close(l.done)
		g.ops.Done()
		return l, nil
	}
	errs := eachRank(len(g.ranks), func(r int) (err error) {
		if l.loads[r], err = g.ranks[r].Load(chain, pages); err != nil {
			return fmt.Errorf("tp: rank %d: %w", r, err)
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		for _, rl := range l.loads {
			if rl != nil {
				_ = rl.Wait()
			}
		}
		g.ops.Done()
		return nil, err
	}
	go func() {
		for _, rl := range l.loads {
			_ = rl.Wait()
		}
		g.stats.restored.Add(int64(l.Blocks()))
		close(l.done)
		g.ops.Done()
	}()
	return l, nil
}

// Cached is the group hit at Load (blocks resident on every rank).
func (l *Load) Cached() int { return l.hit }

// Planned is the number of leading blocks every rank chose to load (the
// smallest plan, at most Cached).
func (l *Load) Planned() int {
	n := l.hit
	for _, rl := range l.loads {
		if rl != nil {
			n = min(n, rl.Planned())
		}
	}
	return n
}

// Blocks is the number of leading chain blocks restored on every rank; it
// only decreases while the load runs and is final after Wait.
func (l *Load) Blocks() int {
	n := l.hit
	for _, rl := range l.loads {
		if rl != nil {
			n = min(n, rl.Blocks())
		}
	}
	return n
}

// WaitLayer blocks until layer is restored on every rank (or their loads
// ended). The error is about a rank's load as a whole (its store closing),
// naming the rank; a failed run is a shorter Blocks, not an error.
func (l *Load) WaitLayer(layer int) error {
	var errs []error
	for r, rl := range l.loads {
		if rl == nil {
			continue
		}
		if err := rl.WaitLayer(layer); err != nil {
			errs = append(errs, fmt.Errorf("tp: rank %d: %w", r, err))
		}
	}
	return errors.Join(errs...)
}

// StreamWaitLayer makes rank's CUDA stream (on that rank's device) wait
// until layer is in rank's KV tensors, with no host round trip (PathGPU
// only: runtime.ErrNotGPU otherwise). Each rank's compute stream waits for
// its own shard; nothing synchronises ranks on the host.
func (l *Load) StreamWaitLayer(rank, layer int, stream uintptr) error {
	if rank < 0 || rank >= len(l.loads) {
		return fmt.Errorf("tp: StreamWaitLayer: rank %d out of range [0, %d)", rank, len(l.loads))
	}
	if l.loads[rank] == nil {
		return nil // nothing was loaded
	}
	return l.loads[rank].StreamWaitLayer(layer, stream)
}

// Wait blocks until every rank's load ended; then Blocks is final.
func (l *Load) Wait() error {
	<-l.done
	var errs []error
	for r, rl := range l.loads {
		if rl == nil {
			continue
		}
		if err := rl.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("tp: rank %d: %w", r, err))
		}
	}
	return errors.Join(errs...)
}

// Rank returns rank r's load (nil when the group hit was 0).
func (l *Load) Rank(r int) *runtime.Load { return l.loads[r] }
