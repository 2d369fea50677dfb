package runtime

import (
	"fmt"

	"github.com/tutti-io/tutti/runtime/internal/ring"
	"github.com/tutti-io/tutti/uring"
)

// slot is one unit of off-heap staging plus the I/O request that fills or
// drains it. At most one I/O uses a slot at a time.
type slot struct {
	buf  *uring.Buffer
	data []byte // buf.Bytes(), cached
	req  ring.Req

	// Per use, set by the user of the slot: what the staged bytes are, where
	// to report the completion (a channel with room for every slot, so the
	// I/O worker never blocks), and whether it was reported.
	tag       segment
	sink      chan *slot
	completed bool

	// wbufs are the slot cut into save write buffers, made the first time a
	// save holds it (saveWbufs).
	wbufs []*wbuf

	// iov lists a direct read's entries (PathCPU, loaddirect.go); nil when
	// the store stages its reads, iovErr why when that was not its choice.
	iov    *uring.Iovecs
	iovErr error
}

// ioDone runs on the I/O worker goroutine.
func (s *slot) IODone(*ring.Req) { s.sink <- s }

// stagingPool is a fixed set of slots allocated at Open. acquire blocks
// while all are in use; nothing is allocated after Open.
type stagingPool struct {
	slotBytes int64
	all       []*slot
	free      chan *slot
}

func newStagingPool(totalBytes, slotBytes int64) (*stagingPool, error) {
	n := int(totalBytes / slotBytes)
	p := &stagingPool{slotBytes: slotBytes, free: make(chan *slot, n)}
	for i := 0; i < n; i++ {
		b, err := uring.AllocBuffer(int(slotBytes))
		if err != nil {
			p.close()
			return nil, fmt.Errorf("allocating staging slot %d of %d (%d bytes): %w", i, n, slotBytes, err)
		}
		s := &slot{buf: b, data: b.Bytes()}
		s.req.Owner = s
		p.all = append(p.all, s)
		p.free <- s
	}
	return p, nil
}

func (p *stagingPool) acquire() *slot { return <-p.free }

// tryAcquire returns nil when no slot is free.
func (p *stagingPool) tryAcquire() *slot {
	select {
	case s := <-p.free:
		return s
	default:
		return nil
	}
}

func (p *stagingPool) release(s *slot) { p.free <- s }

func (p *stagingPool) close() error {
	var first error
	for _, s := range p.all {
		if err := s.buf.Free(); err != nil && first == nil {
			first = err
		}
		if s.iov != nil {
			if err := s.iov.Free(); err != nil && first == nil {
				first = err
			}
		}
		for _, b := range s.wbufs {
			if err := b.freeIovecs(); err != nil && first == nil {
				first = err
			}
		}
	}
	p.all = nil
	return first
}
