package cpu

import (
	"errors"
	"fmt"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/runtime/internal/ring"
	"github.com/tutti-io/tutti/runtime/internal/staging"
	"github.com/tutti-io/tutti/runtime/internal/workpool"
	"github.com/tutti-io/tutti/sched"
	"github.com/tutti-io/tutti/uring"
)

// The consume pool verifies and scatters every completed staging slot of
// the store's restores (CRC32C of each chunk, then the copy from staging
// into the KV pages, or the check where a direct read landed): that is the
// CPU work of a restore, enough that one goroutine per load would cap a
// restore below what fast devices deliver. Every segment goes there, a
// split read's in any order (splitread.go). A job holds its slot until the
// worker releases it, so the queue (one entry per slot) never fills;
// workers never block (each restore's result channel has room for every
// segment of it).
func newConsumePool(m *Mover, slots int) *workpool.Pool[*staging.Slot] {
	return workpool.New(slots, m.consumeSegment)
}

// consumed is a segment a worker finished: the driver retires its read
// when readDone (the read's last segment to be consumed).
type consumed struct {
	io            sched.IO
	overreadBytes int64
	readDone      bool
}

// consumeSegment verifies and scatters a completed segment on a consume
// pool worker, releases its slot and tells the driver, with readDone once
// the segment was its read's last to be consumed.
func (m *Mover) consumeSegment(sl *staging.Slot) {
	seg := &m.slots[sl.ID].seg
	var over int64
	done := true
	if seg.split == nil {
		over = seg.rs.consumeWhole(sl, seg)
	} else {
		over, done = seg.rs.consumeSplit(sl, seg)
	}
	rs, io := seg.rs, seg.io // the slot is another request's once released
	m.staging.Release(sl)
	rs.consumed <- consumed{io: io, overreadBytes: over, readDone: done}
}

// consumeWhole checks a segment that holds its whole read, verifies its
// chunks and scatters its payload. It returns the read's overread bytes
// (alignment slack).
func (rs *restore) consumeWhole(sl *staging.Slot, seg *segment) (overreadBytes int64) {
	sp := &seg.span
	r := rs.r.Runs[seg.io.Run]
	ver, err := r.Info.NewChunkVerifier(*sp)
	if err != nil {
		panic(fmt.Sprintf("cpu mover: %v", err)) // recovery and commit keep every run's chunk CRCs
	}
	if !rs.scatter(sl, seg, &ver) {
		return 0
	}
	if err := ver.Done(); err != nil {
		rs.r.Load.Fail(seg.io.Run, mover.MissCRC, fmt.Errorf("run %d: %w", r.Info.ID, err))
		return 0
	}
	return sp.IOBytes - sp.DataBytes
}

// consumeSplit checks one segment of a split read, scatters its payload and
// hands the CRCs of its chunk pieces to the read's check. done reports that
// it was the read's last segment to be consumed; the overread bytes are
// the read's, returned with done.
func (rs *restore) consumeSplit(sl *staging.Slot, seg *segment) (overreadBytes int64, done bool) {
	sp := &seg.span
	r := rs.r.Runs[seg.io.Run]
	lo := max(seg.objOff, sp.Skip)
	crcs := segCRCs{next: lo - sp.Skip, chunkBytes: sp.ChunkBytes}
	ok := rs.scatter(sl, seg, &crcs)
	done, err := seg.split.add(crcs.pieces, !ok)
	if err != nil {
		if ok {
			rs.r.Load.Fail(seg.io.Run, mover.MissCRC, fmt.Errorf("run %d: %w", r.Info.ID, err))
			ok = false
		}
		// Whether or not this segment's run had failed already: the read
		// must not count as done before its bad run left the index.
		if errors.Is(err, objmap.ErrChunkCRC) {
			rs.r.Load.Corrupt(seg.io.Run)
		}
	}
	if done && ok && rs.r.Load.Valid(seg.io.Run) {
		return sp.IOBytes - sp.DataBytes, true
	}
	return 0, done
}

// scatter checks that sl's read completed whole and copies its payload into
// the KV pages through ck. false: the run failed (now or before) and the
// segment's bytes were not used.
func (rs *restore) scatter(sl *staging.Slot, seg *segment, ck chunkChecker) bool {
	sp := &seg.span
	run := seg.io.Run
	r := rs.r.Runs[run]
	if !rs.r.Load.Valid(run) {
		return false
	}
	req := &sl.Req
	switch {
	case req.Err != nil:
		rs.r.Load.Fail(run, missCauseOf(req.Err), req.Err)
		return false
	case req.Result != seg.ioBytes:
		rs.r.Load.Fail(run, mover.MissShortRead, fmt.Errorf("read %d of %d bytes at span offset %d", req.Result, seg.ioBytes, seg.objOff))
		return false
	}
	// The payload inside this segment: [lo, hi) of the read.
	lo := max(seg.objOff, sp.Skip)
	hi := min(seg.objOff+seg.ioBytes, sp.Skip+sp.DataBytes)
	if lo < hi {
		g := rs.m.g
		pages := rs.r.Pages[r.ChainPos*g.ChunkPages:]
		var err error
		if seg.direct {
			err = rs.m.kv.checkPages(seg.io.Layer, pages, lo-sp.Skip, hi-sp.Skip, ck)
		} else {
			err = rs.m.kv.restorePages(seg.io.Layer, pages, lo-sp.Skip, hi-sp.Skip, sl.Data[lo-seg.objOff:hi-seg.objOff], ck)
		}
		if err != nil {
			rs.r.Load.Fail(run, mover.MissCRC, fmt.Errorf("run %d: %w", r.Info.ID, err))
			rs.r.Load.Corrupt(run)
			return false
		}
	}
	return true
}

func missCauseOf(err error) mover.Miss {
	if errors.Is(err, ring.ErrClosed) || errors.Is(err, uring.ErrClosed) {
		return mover.MissClosed
	}
	return mover.MissIOError
}
