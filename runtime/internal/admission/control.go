package admission

import (
	"errors"
	"fmt"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/prefix"
	"github.com/tutti-io/tutti/runtime/internal/catalog"
	"github.com/tutti-io/tutti/runtime/internal/kvmeta"
)

// Control is what a save's transaction asks of the store's index, catalog
// and pool: the control path. Local serves it from the store's own parts; a
// store connected to a node's service (runtime.Connect) serves it over the
// service's socket, while the save's writes stay in the engine. Each call
// is one step of the transaction; an implementation must keep the index,
// the catalog and the pool consistent across it, as Local does.
type Control interface {
	// Lookup is how many leading blocks of chain are cached.
	Lookup(chain []uint64) int
	// Reserve reserves the blocks of chain after its cached prefix
	// chain[:from] in the index (partial admission: n and stop), freeing
	// what it evicted for room; one step, so that a save's admission is one
	// request to a service. ready is the journal's state (journalReady): an
	// error reserves nothing (which would evict blocks for a save that
	// cannot stay) and is returned with from; a service checks its own.
	Reserve(chain []uint64, meta []kvmeta.Meta, ready func() error) (from, n int, stop prefix.StopReason, err error)
	// Allocate reserves pool space for n blocks in runs striped ways ways,
	// making frees durable and evicting runs where the pool is short (a
	// shortfall returns what fit, with objmap.ErrNoSpace or not).
	Allocate(n, ways int) ([]objmap.Reservation, error)
	// AllocateOne reserves one run of k blocks (a run the scheduler cut).
	AllocateOne(k int) (objmap.Reservation, error)
	// Abort gives a pool reservation back.
	Abort(r objmap.Reservation) error
	// Unreserve drops pending index blocks (and their pending
	// descendants), freeing what that released.
	Unreserve(ids []uint64) error
	// Commit makes reqs durable (objmap.Map.Commit: header, chunk table,
	// fdatasync, journal) and serves them (catalog.Commit). On an error
	// none is served and the pool holds none of them.
	Commit(reqs []objmap.CommitRequest) error
	// Layout is where the pool's runs lie (objmap.Layout, the one home of
	// placement): a connected store's is the service's, sent in its hello.
	Layout() objmap.Layout
}

// Local is the Control of a store's own index, catalog and map.
type Local struct {
	Index   *kvmeta.Index
	Catalog *catalog.Catalog
	Map     *objmap.Map
}

func (l *Local) Lookup(chain []uint64) int { return l.Index.Lookup(chain) }

func (l *Local) Reserve(chain []uint64, meta []kvmeta.Meta, ready func() error) (int, int, prefix.StopReason, error) {
	from := l.Index.Lookup(chain)
	if err := ready(); err != nil {
		return from, 0, 0, err
	}
	res, err := l.Index.Reserve(chain, from, l.Catalog.BytesPerBlock(), meta)
	if err != nil {
		return from, 0, 0, err
	}
	l.Catalog.Release(res.Evicted)
	return from, res.N, res.Stop, nil
}

// Allocate tries again, at most twice, when the pool has less room than
// the index had (quarantined frees, headers, padding, fragmentation): first
// after making the frees durable (which releases their quarantine: a save
// right after an eviction or a Discard finds the space those freed), then
// after evicting runs that hold the shortfall too.
func (l *Local) Allocate(n, ways int) ([]objmap.Reservation, error) {
	resv, err := l.Map.AllocateStriped(n, ways)
	for try := 0; try < 2; try++ {
		got := reservedChunks(resv)
		if got == n || (err != nil && !errors.Is(err, objmap.ErrNoSpace)) {
			break
		}
		if try == 0 && l.Map.Stats().QuarantinedBytes == 0 {
			continue // nothing to release: go on to evicting
		}
		for _, r := range resv {
			_ = l.Map.Abort(r)
		}
		if try == 1 {
			l.Catalog.EvictRuns(l.Map.Layout().RunBytes(n - got))
		}
		if serr := l.Map.Sync(); serr != nil {
			return nil, serr
		}
		resv, err = l.Map.AllocateStriped(n, ways)
	}
	return resv, err
}

func (l *Local) AllocateOne(k int) (objmap.Reservation, error) {
	got, err := l.Map.Allocate(k)
	if err != nil || len(got) != 1 || got[0].Chunks != k {
		for _, r := range got {
			_ = l.Map.Abort(r)
		}
		if err == nil {
			err = fmt.Errorf("admission: allocating one run of %d blocks: %w", k, objmap.ErrNoSpace)
		}
		return objmap.Reservation{}, err
	}
	return got[0], nil
}

func (l *Local) Abort(r objmap.Reservation) error { return l.Map.Abort(r) }

func (l *Local) Unreserve(ids []uint64) error {
	dropped, err := l.Index.Abort(ids)
	if err != nil {
		return err
	}
	l.Catalog.Release(dropped)
	return nil
}

func (l *Local) Commit(reqs []objmap.CommitRequest) error {
	if err := l.Map.Commit(reqs); err != nil {
		return err
	}
	for _, r := range reqs {
		l.Catalog.Commit(r.Res.ID, r.Chain)
	}
	return nil
}

func (l *Local) Layout() objmap.Layout { return l.Map.Layout() }
