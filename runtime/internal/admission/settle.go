package admission

import (
	"fmt"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/sched"
)

// IOs is where the scheduler routes the save's writes (nil: none).
func (t *Txn) IOs() <-chan sched.IO { return t.ios }

// Writes is how many writes the scheduler routes for the save: each must be
// retired (Retire), written or not.
func (t *Txn) Writes() int {
	n := 0
	for _, r := range t.runs {
		n += r.Writes
	}
	return n
}

// GatherWrites is how many of the writes read the engine's pages when
// written: the save's pages are released once each of them was gathered or
// given up.
func (t *Txn) GatherWrites() int {
	n := 0
	for _, r := range t.runs {
		if r.gathers {
			n += r.Writes
		}
	}
	return n
}

// RunOf is the run a routed write belongs to (its ReqID).
func (t *Txn) RunOf(reqID uint64) int {
	for i, r := range t.runs {
		if r.ReqID == reqID {
			return i
		}
	}
	panic(fmt.Sprintf("admission: write for unknown save request %d", reqID))
}

// Target is where run i's writes go: its pool reservation and its first
// chain position. Neither changes once Admit returned, so a stage worker
// may ask while the driver settles.
func (t *Txn) Target(i int) (objmap.Reservation, int) { return t.runs[i].Res, t.runs[i].ChainPos }

// Writable reports whether run i's writes go to disk; the writes of a run
// given up (or failed) are retired without I/O.
func (t *Txn) Writable(i int) bool { return t.runs[i].state == Writing }

// Gathers reports whether run i's writes count toward the save's
// Gathered (GatherWrites).
func (t *Txn) Gathers(i int) bool { return t.runs[i].gathers }

// Started counts a write of run i handed to a stage worker.
func (t *Txn) Started(i int) { t.runs[i].inflight++ }

// Completed counts a write of run i that completed (or failed to gather):
// err fails the run, else its chunk pieces are kept for the commit.
func (t *Txn) Completed(i int, parts []mover.Piece, err error) {
	r := t.runs[i]
	r.inflight--
	switch {
	case r.state != Writing:
	case err != nil:
		r.state, r.err = Failed, err
	default:
		r.parts = append(r.parts, parts...)
	}
}

// Retire counts one write of run i retired, and reports whether it was the
// run's last (the scheduler then drops the request's route).
func (t *Txn) Retire(i int) (last bool) {
	r := t.runs[i]
	r.remaining--
	return r.remaining == 0
}

// Settle commits (or gives up) runs in chain order as far as their writes
// are done. Runs ready together are committed together: one objmap Commit
// (one fdatasync per pool file, one journal group). The driver calls it
// when none of the save's writes is in flight (a commit's syncs then never
// leave the devices idle while writes wait) and once at the end, when
// every run settles.
func (t *Txn) Settle() {
	cb := t.st.Geo.ChunkBytesPerLayer()
	for t.next < len(t.runs) {
		r := t.runs[t.next]
		switch {
		case r.state == Committed || r.state == Aborted:
			t.next++
		case !t.ready(t.next):
			return
		case r.state == Draining:
			_ = t.st.Ctl.Abort(r.Res)
			r.held, r.state = false, Aborted
			t.next++
		case r.state == Failed:
			t.giveUp(t.next, Failure, r.err)
			t.next++
		default:
			if err := r.chunkCRCs(cb); err != nil {
				r.state, r.err = Failed, err // given up on the next pass
				continue
			}
			j := t.next + 1
			for j < len(t.runs) && j-t.next < objmap.MaxCommitBatch && t.ready(j) {
				x := t.runs[j]
				if x.state != Writing {
					break
				}
				if err := x.chunkCRCs(cb); err != nil {
					x.state, x.err = Failed, err
					break
				}
				j++
			}
			t.commit(t.next, j)
			t.next = j
		}
	}
}

// chunkCRCs folds the run's chunk pieces into its chunk table.
func (r *Run) chunkCRCs(chunkBytes int64) error {
	if err := mover.ChunkCRCs(r.parts, r.crcs, chunkBytes); err != nil {
		return fmt.Errorf("run %d: %w", r.Res.ID, err)
	}
	return nil
}

// commit makes runs [i, j) durable (their payload writes all completed):
// objmap writes each header (with its parent) and chunk CRC table,
// fdatasyncs, and journals the commits as one group; then the catalog
// serves them. On a failure they and every later run are given up.
func (t *Txn) commit(i, j int) {
	batch := t.runs[i:j]
	reqs := make([]objmap.CommitRequest, len(batch))
	for k, r := range batch {
		reqs[k] = objmap.CommitRequest{Res: r.Res, Chain: t.chain[r.ChainPos : r.ChainPos+r.Res.Chunks], ChunkCRCs: r.crcs}
		if r.ChainPos > 0 {
			reqs[k].Parent, reqs[k].HasParent = t.chain[r.ChainPos-1], true
		}
	}
	if err := t.st.Ctl.Commit(reqs); err != nil {
		// objmap aborted the reservations unless the journal failed; either
		// way nothing of them is served, and the pool holds none of them.
		for _, r := range batch {
			r.held = false
		}
		t.giveUp(i, Failure, err)
		return
	}
	for k, r := range batch {
		r.held, r.state = false, Committed
		t.ev.Saved(len(reqs[k].Chain))
	}
}

// Pieces is what the save's committed runs were checksummed from: the chunk
// pieces of their writes and their chunk entries (equal: no write cut a
// chunk, so the commit combined no CRCs). For tests and diagnostics, after
// the save's last Settle.
func (t *Txn) Pieces() (pieces, entries int) {
	for _, r := range t.runs {
		if r.state == Committed {
			pieces, entries = pieces+len(r.parts), entries+len(r.crcs)
		}
	}
	return pieces, entries
}
