package runtime

// A Save's I/O phase: the goroutine that gathers and submits the writes the
// scheduler dispatches, checksums them, and commits runs in chain order.

import (
	"fmt"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/sched"
	"golang.org/x/sys/unix"
)

// drive is the save's goroutine: it gathers and submits the writes the
// scheduler dispatches, then commits runs in chain order (a block is
// committed only after its parent).
func (sv *Save) drive() {
	s := sv.s
	queue := make([]sched.IO, 0, sv.writesLeft)
	ring := make([]*slot, 0, len(s.staging.all))
	inflight := make([]int, len(sv.runs)) // writes submitted, per run
	remaining := make([]int, len(sv.runs))
	for i, r := range sv.runs {
		remaining[i] = r.writes
	}
	nextCommit := 0
	retire := func(io sched.IO, ri int) {
		remaining[ri]--
		sv.writesLeft--
		s.sched.complete(io, remaining[ri] == 0)
	}
	for sv.writesLeft > 0 || len(ring) > 0 {
		for len(queue) > 0 {
			io := queue[0]
			ri := sv.runOf(io.ReqID)
			r := sv.runs[ri]
			if r.skip || r.failed != nil {
				queue = queue[1:]
				if r.admitted {
					sv.gathered1()
				}
				retire(io, ri)
				continue
			}
			var sl *slot
			if len(ring) == 0 {
				sl = s.staging.acquire()
			} else if sl = s.staging.tryAcquire(); sl == nil {
				break
			}
			queue = queue[1:]
			sv.stage(sl, io, r)
			sv.batch(s.deviceOf(r.res.File)).start(s.sched.nowNs(), sl.tag.ioBytes)
			sv.withReads = sv.withReads || len(s.loadN) > 0
			sl.sink, sl.completed = sv.sink, false
			ring = append(ring, sl)
			inflight[ri]++
			s.stats.writeIOs.Add(1)
			s.worker.submit(&sl.req)
		}
		if len(ring) > 0 && ring[0].completed {
			sl := ring[0]
			copy(ring, ring[1:])
			ring = ring[:len(ring)-1]
			ri := sv.runOf(sl.tag.io.ReqID)
			r := sv.runs[ri]
			inflight[ri]--
			sv.batch(s.deviceOf(r.res.File)).lastNs = s.sched.nowNs()
			if r.failed == nil {
				if sl.req.err != nil {
					r.failed = fmt.Errorf("writing run %d layer %d: %w", r.res.ID, sl.tag.io.Layer, sl.req.err)
				} else if sl.req.result != sl.tag.ioBytes {
					r.failed = fmt.Errorf("writing run %d layer %d: %d of %d bytes: %w", r.res.ID, sl.tag.io.Layer, sl.req.result, sl.tag.ioBytes, unix.EIO)
				}
			}
			io := sl.tag.io // the slot is another request's once released
			s.staging.release(sl)
			retire(io, ri)
			nextCommit = sv.commitReady(nextCommit, remaining, inflight)
			continue
		}
		if sv.writesLeft == 0 && len(ring) == 0 {
			break
		}
		select {
		case io := <-sv.ios:
			queue = append(queue, io)
		case sl := <-sv.sink:
			sl.completed = true
		}
	}
	sv.commitReady(nextCommit, remaining, inflight)
	for dev, b := range sv.batches {
		if b.ops > 0 {
			s.sched.observeWrites(dev, b.bytes, int(b.ops), b.lastNs-b.firstNs, sv.withReads)
		}
	}
	sv.finish()
}

// ioBatch is one device's share of a save's writes or a load's reads: bytes
// and ops submitted, from the first submission to the last completion.
type ioBatch struct {
	bytes, ops, firstNs, lastNs int64
}

func (b *ioBatch) start(nowNs, bytes int64) {
	if b.ops == 0 {
		b.firstNs = nowNs
	}
	b.bytes += bytes
	b.ops++
}

// batch is device dev's ioBatch (the store's devices are few: one per
// directory).
func (sv *Save) batch(dev int) *ioBatch { return batchOf(&sv.batches, dev) }

// batchOf is device dev's entry of bs, grown to hold it.
func batchOf(bs *[]ioBatch, dev int) *ioBatch {
	if dev >= len(*bs) {
		*bs = append(*bs, make([]ioBatch, dev+1-len(*bs))...)
	}
	return &(*bs)[dev]
}

// gathered1 counts one write gathered (or given up) and closes Gathered
// after the last.
func (sv *Save) gathered1() {
	sv.gatherLeft--
	if sv.gatherLeft == 0 {
		close(sv.gathered)
	}
}

// stage gathers one dispatched write into sl and prepares it.
func (sv *Save) stage(sl *slot, io sched.IO, r *saveRun) {
	s := sv.s
	g := s.geo
	dataBytes := io.Bytes
	ioBytes := (dataBytes + objmap.BlockBytes - 1) &^ (objmap.BlockBytes - 1)
	buf := sl.data[:ioBytes]
	if s.gpu != nil {
		// Writes are cut at whole pages on this path (gpuWriteUnit).
		pb := g.PageBytesPerLayer()
		first := r.chainPos*g.ChunkPages + int(io.OffsetBytes/pb)
		if err := s.gpu.gather(sv.pages[first:first+int(dataBytes/pb)], io.Layer, sl.buf.Addr(), dataBytes); err != nil && r.failed == nil {
			r.failed = fmt.Errorf("gathering run %d layer %d from the GPU: %w", r.res.ID, io.Layer, err)
		}
	} else {
		s.kv.copyPages(io.Layer, sv.pages[r.chainPos*g.ChunkPages:], io.OffsetBytes, io.OffsetBytes+dataBytes, buf[:dataBytes], false)
	}
	clear(buf[dataBytes:]) // padding: deterministic bytes on disk
	if !r.crcStale && r.nextOff[io.Layer] == io.OffsetBytes {
		r.feedCRCs(io.Layer, buf[:dataBytes], g.ChunkBytesPerLayer())
	} else {
		r.crcStale = true
	}
	sv.gathered1()
	if r.crcStale && sv.gatherLeft == 0 {
		sv.recomputeCRCs()
	}
	objOff, _ := g.ObjectOffset(r.res.Chunks, io.Layer)
	sl.tag = segment{io: io, objOff: io.OffsetBytes, dataBytes: dataBytes, ioBytes: ioBytes}
	sl.req.c.PrepWrite(s.m.Files()[r.res.File], sl.buf.Addr(), uint32(ioBytes), uint64(r.res.Offset+objOff+io.OffsetBytes))
}

// feedCRCs continues the chunk CRCs of layer with the next payload bytes
// (writes of one layer come in order; stage checks).
func (r *saveRun) feedCRCs(layer int, data []byte, chunkBytes int64) {
	for len(data) > 0 {
		off := r.nextOff[layer]
		n := min(int64(len(data)), chunkBytes-off%chunkBytes)
		i := layer*r.res.Chunks + int(off/chunkBytes)
		r.crcs[i] = objmap.UpdateCRC32C(r.crcs[i], data[:n])
		r.nextOff[layer] += n
		data = data[n:]
	}
}

// recomputeCRCs computes the chunk CRCs of runs whose writes were
// dispatched out of order straight from the pages. It runs before Gathered
// closes, so the pages are still the saved ones.
func (sv *Save) recomputeCRCs() {
	g := sv.s.geo
	pb := g.PageBytesPerPlane()
	for _, r := range sv.runs {
		if !r.crcStale || r.skip {
			continue
		}
		if sv.s.gpu != nil {
			// The pages are in HBM: no CRC without reading them back; give
			// the run up rather than commit a CRC that may be wrong.
			if r.failed == nil {
				r.failed = fmt.Errorf("run %d: writes dispatched out of order on the GPU path: %w", r.res.ID, errCRCOrder)
			}
			continue
		}
		for l := 0; l < g.Layers; l++ {
			for c := 0; c < r.res.Chunks; c++ {
				crc := uint32(0)
				for p := 0; p < g.ChunkPages; p++ {
					page := sv.pages[(r.chainPos+c)*g.ChunkPages+p]
					for pl := 0; pl < g.Planes; pl++ {
						crc = objmap.UpdateCRC32C(crc, sv.s.kv.plane(l, pl, page)[:pb])
					}
				}
				r.crcs[l*r.res.Chunks+c] = crc
			}
		}
		r.crcStale = false
	}
}

// commitReady commits (or gives up) runs in chain order from next on, as
// far as their writes are done, and returns the first run not done. Runs
// ready together are committed together: one parent-log sync, one objmap
// Commit (one fdatasync per pool file, one journal group).
func (sv *Save) commitReady(next int, remaining, inflight []int) int {
	ready := func(i int) bool { return remaining[i] == 0 && inflight[i] == 0 }
	for next < len(sv.runs) {
		r := sv.runs[next]
		switch {
		case r.done:
			next++
		case !ready(next):
			return next
		case r.mapAbort:
			_ = sv.s.m.Abort(r.res)
			r.done = true
			next++
		case r.failed != nil:
			sv.abortRuns(next, skipCauseOf(r.failed), remaining, inflight)
			next++
		case r.skip:
			next++
		default:
			j := next + 1
			for j < len(sv.runs) && j-next < objmap.MaxCommitBatch && ready(j) {
				if x := sv.runs[j]; x.done || x.mapAbort || x.failed != nil || x.skip {
					break
				}
				j++
			}
			sv.commit(next, j, remaining, inflight)
			next = j
		}
	}
	return next
}

// commit makes runs [i, j) durable (their payload writes all completed):
// objmap writes each header (with its parent) and chunk CRC table,
// fdatasyncs, and journals the commits as one group; then they are served.
// On a failure they and every later run are given up.
func (sv *Save) commit(i, j int, remaining, inflight []int) {
	s := sv.s
	batch := sv.runs[i:j]
	reqs := make([]objmap.CommitRequest, len(batch))
	for k, r := range batch {
		reqs[k] = objmap.CommitRequest{Res: r.res, Chain: sv.chain[r.chainPos : r.chainPos+r.res.Chunks], ChunkCRCs: r.crcs}
		if r.chainPos > 0 {
			reqs[k].Parent, reqs[k].HasParent = sv.chain[r.chainPos-1], true
		}
	}
	if err := s.m.Commit(reqs); err != nil {
		// objmap aborted the reservations unless the journal failed; either
		// way nothing of them is served.
		var blocks []uint64
		for _, r := range batch {
			r.done = true
			blocks = append(blocks, sv.chain[r.chainPos:r.chainPos+r.res.Chunks]...)
		}
		sv.abortIDs(blocks)
		sv.skip(skipCauseOf(err), len(blocks))
		sv.abortRuns(j, skipCauseOf(err), remaining, inflight)
		return
	}
	for k, r := range batch {
		chain := reqs[k].Chain
		info, ok := s.m.Lookup(r.res.ID)
		if !ok {
			panic(fmt.Sprintf("runtime: run %d committed but unknown to objmap", r.res.ID))
		}
		e := s.newRunEntry(info)
		s.mu.Lock()
		s.runs[e.id] = e
		s.mu.Unlock()
		locs := make([]uint64, len(chain))
		for c := range locs {
			locs[c] = loc(e.id, c)
		}
		dropped, cerr := s.idx.Commit(chain, locs)
		if cerr != nil {
			panic(fmt.Sprintf("runtime: committing run %d in the index: %v", e.id, cerr))
		}
		s.release(dropped)
		r.done = true
		sv.mu.Lock()
		sv.saved += len(chain)
		sv.mu.Unlock()
		s.stats.savedBlocks.Add(int64(len(chain)))
		s.stats.savedBytes.Add(int64(len(chain)) * s.geo.ChunkBytes())
		s.stats.committedRuns.Add(1)
	}
}

func (sv *Save) finish() {
	select {
	case <-sv.gathered:
	default:
		close(sv.gathered)
	}
	close(sv.done)
	sv.s.ops.Done()
	sv.s.mu.Lock()
	sv.s.savesLive--
	sv.s.mu.Unlock()
	sv.s.savesCond.Broadcast()
}
