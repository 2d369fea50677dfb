package runtime

import (
	"errors"
	"fmt"

	"github.com/tutti-io/tutti/runtime/internal/admission"
	"github.com/tutti-io/tutti/runtime/internal/catalog"
	"github.com/tutti-io/tutti/runtime/internal/mover"
)

// control is a store's control path: the prefix index, the catalog of
// served runs, the pool's allocation and commits, eviction and KV events.
// An opened store serves it from its own parts (localControl); a store
// connected to a node's service (Connect) asks the service over its socket
// (remoteControl), while its data path (reads and writes of the pool
// files, which it opens itself) stays in the engine. Saves use the
// embedded admission.Control; loads pin, resolve and unpin here.
type control interface {
	admission.Control
	// pin pins the cached leading blocks of chain and resolves those after
	// skip to runs (chain positions counted from skip); a block whose run
	// is unknown ends the prefix (counted in miss as MissNotFound). The
	// pin lasts until unpin.
	pin(chain []uint64, skip int, miss *[numMissCauses]int64) *pinned
	// unpin releases p (once).
	unpin(p *pinned)
	// corrupt takes run i of p out of service (its payload failed its
	// CRC); it reports whether this call did.
	corrupt(p *pinned, i int) bool
	discard(id uint64) (int, error)
	resident() []ResidentBlock
	// journalReady is nil unless nothing can commit now (Store.journalReady).
	journalReady() error
	// keepsMeta reports whether saves' block metadata is kept (the control
	// path publishes KV events).
	keepsMeta() bool
}

// pinned is a load's (or a hold's) pin: chain[:n] is pinned, runs are its
// blocks after the skipped ones.
type pinned struct {
	chain   []uint64
	n       int
	runs    []mover.Run
	entries []*catalog.Run // local: runs[i]'s in the catalog
	id      uint64         // remote: the service's handle
	sess    *session       // remote: the connection the handle is of
}

// ioBegin and ioEnd bracket a load's reads of p's runs: a remote pin's
// session counts them (a lost session is redialed only once none is left).
func (p *pinned) ioBegin() {
	if p.sess != nil {
		p.sess.io.Add(1)
	}
}

func (p *pinned) ioEnd() {
	if p.sess != nil {
		p.sess.io.Add(-1)
	}
}

// localControl is the control path of an opened store: its own index,
// catalog and object map.
type localControl struct {
	admission.Local
	s *Store
}

func (c *localControl) pin(chain []uint64, skip int, miss *[numMissCauses]int64) *pinned {
	p := &pinned{chain: chain}
	var locs []uint64
	p.n, locs = c.Index.Pin(chain, nil)
	if p.n <= skip {
		return p
	}
	spans, notFound := c.Catalog.Resolve(chain[skip:p.n], locs[skip:p.n])
	miss[MissNotFound] += int64(notFound)
	for _, sp := range spans {
		r := sp.Run
		p.runs = append(p.runs, mover.Run{Info: &r.Info, First: sp.First, K: sp.K, ChainPos: sp.ChainPos})
		p.entries = append(p.entries, r)
	}
	return p
}

func (c *localControl) unpin(p *pinned) {
	if p.n == 0 {
		return
	}
	dropped, err := c.Index.Unpin(p.chain[:p.n])
	if err != nil {
		// Only a runtime bug gets here: pins are taken and released in pairs.
		panic(fmt.Sprintf("runtime: unpinning: %v", err))
	}
	c.Catalog.Release(dropped)
}

func (c *localControl) corrupt(p *pinned, i int) bool { return c.Catalog.DropCorrupt(p.entries[i]) }

func (c *localControl) discard(id uint64) (int, error) {
	dropped, err := c.Index.Remove(id)
	if err != nil {
		return 0, err
	}
	c.Catalog.Release(dropped)
	return len(dropped), nil
}

func (c *localControl) resident() []ResidentBlock {
	blocks := c.Catalog.Resident()
	out := make([]ResidentBlock, len(blocks))
	for i, b := range blocks {
		out[i] = ResidentBlock(b)
	}
	return out
}

// journalReady: see Store.journalReady.
func (c *localControl) journalReady() error {
	m := c.Map
	if m.Failing() == nil {
		return nil
	}
	if err := m.Sync(); err != nil {
		return err
	}
	return m.Failing()
}

func (c *localControl) keepsMeta() bool { return c.Index.Publisher() != nil }

// errRemote is wrapped by the calls a connected store leaves to its
// service (Check, TakeKVEvents): they are the service's.
var errRemote = errors.New("served by the node's service")
