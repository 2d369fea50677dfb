package kvevents

import (
	"errors"
	"fmt"
)

// ErrNotEngine is returned by Take on a publisher with sockets (its events
// are published by its own goroutine).
var ErrNotEngine = errors.New("kvevents: Take needs Config.Engine")

// TooSmallError is returned by Take when the oldest queued event alone
// does not fit maxBytes; nothing was taken.
type TooSmallError struct{ Need int }

func (e *TooSmallError) Error() string {
	return fmt.Sprintf("kvevents: the next event takes %d bytes", e.Need)
}

// emitEngineLocked queues e for Take. Past MaxQueueEvents the queue is
// dropped (counted) and the next Take lists the contents instead, which
// hold every change the dropped events described; while such a listing is
// due, events are not queued (the listing will show their changes).
func (p *Publisher) emitEngineLocked(e Event) {
	switch {
	case p.closed:
		p.st.dropped.Add(1)
	case p.resync:
	case len(p.pending) >= p.cfg.MaxQueueEvents:
		p.st.dropped.Add(int64(len(p.pending)) + 1)
		p.st.gaps.Add(1)
		p.pending, p.resync = nil, true
	default:
		p.pending = append(p.pending, e)
	}
}

// Take hands an Engine publisher's events to the engine, oldest first: it
// appends them to dst as one msgpack array of events in Config.Format (what
// AppendEvents writes), as many as fit maxBytes and Config.MaxBatchEvents,
// and says how many it took and whether more are queued. When the oldest
// event alone is larger than maxBytes it returns a *TooSmallError and takes
// nothing.
//
// The first Take, and the first after events were dropped, begins with
// AllBlocksCleared followed by the store's contents as BlockStored events,
// parents first (Contents): from there the engine holds exactly what the
// store serves. That AllBlocksCleared means "this store's blocks are the
// ones that follow", about this store only: an engine must not forward it
// to a router, which would drop the engine's other tiers with it. A listing
// may take several calls; the engine calls Take until more is false before
// it acts on what it took.
func (p *Publisher) Take(dst []byte, maxBytes int) (out []byte, n int, more bool, err error) {
	if !p.cfg.Engine {
		return dst, 0, false, ErrNotEngine
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resync && !p.closed {
		p.resync = false
		p.pending = append(p.pending[:0], Event{Kind: AllBlocksCleared})
		if p.contents != nil {
			p.contents(func(e Event) { p.pending = append(p.pending, e) })
		}
	}
	const header = 5 // the largest array header
	var body []byte
	for n < len(p.pending) && n < p.cfg.MaxBatchEvents {
		before := len(body)
		body = AppendEvent(body, &p.pending[n], p.cfg.Format)
		if header+len(body) > maxBytes {
			if n == 0 {
				return dst, 0, len(p.pending) > 0, &TooSmallError{Need: header + len(body)}
			}
			body = body[:before]
			break
		}
		n++
	}
	clear(p.pending[:n])
	p.pending = p.pending[n:]
	if len(p.pending) == 0 {
		p.pending = nil
	}
	if n > 0 {
		p.st.batches.Add(1)
		p.st.events.Add(int64(n))
	}
	dst = appendArray(dst, n)
	return append(dst, body...), n, len(p.pending) > 0, nil
}
