package kvevents

import (
	"encoding/binary"

	"github.com/go-zeromq/zmq4"
)

// endSeq ends a replay answer, as vLLM writes it (-1, 8 bytes big-endian).
var endSeq = seqBytes(-1)

// ring keeps the most recent batches, oldest first, bounded in count and
// bytes (the newest batch is always kept).
type ring struct {
	b          []ringEntry
	bytes      int64
	maxBatches int
	maxBytes   int64
	last       int64
	any        bool
}

type ringEntry struct {
	seq     int64
	payload []byte
}

func (r *ring) lastSeq() int64 {
	if !r.any {
		return -1
	}
	return r.last
}

func (r *ring) push(seq int64, payload []byte) {
	r.last, r.any = seq, true
	r.b = append(r.b, ringEntry{seq: seq, payload: payload})
	r.bytes += int64(len(payload))
	for len(r.b) > 1 && (len(r.b) > r.maxBatches || r.bytes > r.maxBytes) {
		r.bytes -= int64(len(r.b[0].payload))
		r.b[0] = ringEntry{}
		r.b = r.b[1:]
	}
}

// from returns the batches from seq start to the last one, oldest first,
// when the ring holds every one of them without a gap; ok false otherwise.
// start == last+1 (the subscriber is up to date) is an empty ok answer.
func (r *ring) from(start int64) (out []ringEntry, ok bool) {
	if !r.any || start > r.last+1 || start < 0 {
		return nil, false
	}
	for _, e := range r.b {
		if e.seq < start {
			continue
		}
		if e.seq != start+int64(len(out)) {
			return nil, false
		}
		out = append(out, e)
	}
	return out, start+int64(len(out)) == r.last+1
}

// serveReplay answers replay requests one at a time, as vLLM's publisher
// does: from the ring when it covers the gap, else with the current contents.
func (p *Publisher) serveReplay() {
	defer p.wg.Done()
	for {
		msg, err := p.router.Recv()
		if err != nil {
			if p.ctx.Err() != nil {
				return
			}
			p.st.replErrs.Add(1)
			continue
		}
		// Router frames: [identity, "", start_seq].
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 0 || len(msg.Frames[2]) != 8 {
			p.st.replErrs.Add(1)
			continue
		}
		id := msg.Frames[0]
		start := int64(binary.BigEndian.Uint64(msg.Frames[2]))
		if !p.answer(id, start) {
			p.st.replErrs.Add(1)
		}
	}
}

// answer sends the replay for start to client id; false when a send failed.
func (p *Publisher) answer(id []byte, start int64) bool {
	p.sendMu.Lock()
	entries, ok := p.ring.from(start)
	p.sendMu.Unlock()
	var frames [][2][]byte
	if ok {
		p.st.replBuf.Add(1)
		for _, e := range entries {
			frames = append(frames, [2][]byte{seqBytes(e.seq), e.payload})
		}
	} else {
		p.st.replContents.Add(1)
		frames = p.contentsFrames()
	}
	for _, f := range frames {
		if err := p.router.SendMulti(zmq4.NewMsgFrom(id, nil, f[0], f[1])); err != nil {
			return false
		}
	}
	return p.router.SendMulti(zmq4.NewMsgFrom(id, nil, endSeq, nil)) == nil
}

// contentsFrames cuts the queue (so the contents are exactly the state after
// the last numbered batch S), lists the contents in the same step, and
// encodes them as batches numbered S: AllBlocksCleared first.
func (p *Publisher) contentsFrames() [][2][]byte {
	p.mu.Lock()
	cut := p.cutLocked()
	s := p.nextSeq - 1
	evs := []Event{{Kind: AllBlocksCleared}}
	if p.contents != nil {
		p.contents(func(e Event) { evs = append(evs, e) })
	}
	p.mu.Unlock()
	p.send(cut)
	var frames [][2][]byte
	seq := seqBytes(s)
	for len(evs) > 0 {
		n := min(len(evs), p.cfg.MaxBatchEvents)
		payload := AppendBatch(nil, &Batch{TS: nowSeconds(), Events: evs[:n], DataParallelRank: p.cfg.DataParallelRank, Format: p.cfg.Format})
		frames = append(frames, [2][]byte{seq, payload})
		evs = evs[n:]
	}
	return frames
}
