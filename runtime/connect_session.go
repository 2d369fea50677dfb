package runtime

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/prefix"
	"github.com/tutti-io/tutti/runtime/internal/kvmeta"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/runtime/internal/nodewire"
)

// session is one connection of a connected store to its service. The
// service's handles (pins, reservations) are the connection's, so every
// call about one goes to the session that made it: a pin or a save's
// transaction keeps its session (pinned.sess, Save.sess), and once that
// session is lost its calls fail here, never reaching a later connection
// where the same id names something else.
type session struct {
	rc      *remoteControl
	conn    *net.UnixConn
	wmu     sync.Mutex
	next    atomic.Uint64
	mu      sync.Mutex
	waiting map[uint64]chan reply
	lost    error
	done    chan struct{}
	// io counts the loads and saves whose reads or writes may still be in
	// flight under this session's pins and reservations: a later session
	// is dialed only once a lost one's count is 0, so no byte of it lands
	// in space a restarted service hands out again.
	io atomic.Int64
}

type reply struct {
	payload []byte
	err     error
}

// dialSession connects to the service and says hello.
func (rc *remoteControl) dialSession() (*session, *nodewire.HelloResp, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: rc.socket, Net: "unix"})
	if err != nil {
		return nil, nil, fmt.Errorf("runtime: connect to %s: %w", rc.socket, err)
	}
	s := &session{rc: rc, conn: c, waiting: make(map[uint64]chan reply), done: make(chan struct{})}
	go s.read()
	m, err := s.call(nodewire.OpHello, &nodewire.Hello{Version: nodewire.Version, Fingerprint: rc.fingerprint})
	if err != nil {
		s.close()
		return nil, nil, fmt.Errorf("runtime: connect to %s: %w", rc.socket, err)
	}
	return s, m.(*nodewire.HelloResp), nil
}

// read dispatches responses until the connection fails; then every call
// waiting and every later one fails with ErrServiceLost, and the store
// starts dialing again (remoteControl.lost).
func (s *session) read() {
	defer close(s.done)
	for {
		f, _, err := nodewire.ReadFrame(s.conn, nil)
		if err == nil {
			s.mu.Lock()
			ch := s.waiting[f.ID]
			delete(s.waiting, f.ID)
			s.mu.Unlock()
			if ch != nil {
				ch <- reply{payload: f.Payload}
			}
			continue
		}
		s.mu.Lock()
		s.lost = fmt.Errorf("%w: %w", ErrServiceLost, err)
		for id, ch := range s.waiting {
			ch <- reply{err: s.lost}
			delete(s.waiting, id)
		}
		s.mu.Unlock()
		s.rc.lost(s)
		return
	}
}

// call sends req as op and waits for its response.
func (s *session) call(op nodewire.Op, req nodewire.Msg) (nodewire.Msg, error) {
	id := s.next.Add(1)
	ch := make(chan reply, 1)
	s.mu.Lock()
	if s.lost != nil {
		err := s.lost
		s.mu.Unlock()
		return nil, s.rc.failed(err)
	}
	s.waiting[id] = ch
	s.mu.Unlock()
	e := nodewire.Enc{}
	req.Encode(&e)
	s.wmu.Lock()
	_, werr := s.conn.Write(nodewire.AppendFrame(nil, op, id, e.B))
	s.wmu.Unlock()
	if werr != nil {
		_ = s.conn.Close() // the reader fails every waiter, this one too
	}
	r := <-ch
	if r.err != nil {
		return nil, s.rc.failed(r.err)
	}
	m, rerr, err := nodewire.DecodeResponse(op, r.payload)
	if err != nil {
		_ = s.conn.Close()
		return nil, s.rc.failed(fmt.Errorf("%w: %w", ErrServiceLost, err))
	}
	if rerr != nil {
		s.rc.failed(rerr)
	}
	return m, rerr
}

// close closes the connection and waits for its reader.
func (s *session) close() {
	_ = s.conn.Close()
	<-s.done
}

// The control calls of one session (admission.Control and control's pin,
// unpin and corrupt).

func (s *session) Lookup(chain []uint64) int {
	m, err := s.call(nodewire.OpLookup, &nodewire.Lookup{Chain: chain})
	if err != nil {
		return 0 // a miss, counted in failed
	}
	return min(m.(*nodewire.Count).N, len(chain))
}

// Reserve leaves ready to the service, which checks its own journal.
func (s *session) Reserve(chain []uint64, meta []kvmeta.Meta, _ func() error) (int, int, prefix.StopReason, error) {
	req := &nodewire.Reserve{Chain: chain}
	for _, x := range meta {
		req.Meta = append(req.Meta, nodewire.Meta(x))
	}
	m, err := s.call(nodewire.OpReserve, req)
	r, _ := m.(*nodewire.ReserveResp)
	if r == nil {
		return 0, 0, 0, err
	}
	if r.From > len(chain) || r.N > len(chain)-r.From {
		return 0, 0, 0, s.rc.failed(fmt.Errorf("%w: reserved %d blocks after %d of %d", nodewire.ErrProtocol, r.N, r.From, len(chain)))
	}
	return r.From, r.N, r.Stop, err
}

func (s *session) Allocate(n, ways int) ([]objmap.Reservation, error) {
	m, err := s.call(nodewire.OpAllocate, &nodewire.Allocate{N: n, Ways: ways})
	if m == nil {
		return nil, err
	}
	return s.rc.checkRes(m.(*nodewire.Reservations).Res, err)
}

func (s *session) AllocateOne(k int) (objmap.Reservation, error) {
	m, err := s.call(nodewire.OpAllocateOne, &nodewire.AllocateOne{K: k})
	if err != nil {
		return objmap.Reservation{}, err
	}
	res, err := s.rc.checkRes(m.(*nodewire.Reservations).Res, nil)
	if err != nil || len(res) != 1 || res[0].Chunks != k {
		return objmap.Reservation{}, s.rc.failed(fmt.Errorf("%w: one run of %d blocks asked, %d runs given (%v)", nodewire.ErrProtocol, k, len(res), err))
	}
	return res[0], nil
}

func (s *session) Abort(r objmap.Reservation) error {
	_, err := s.call(nodewire.OpAbort, &nodewire.Abort{Res: r})
	return err
}

func (s *session) Unreserve(ids []uint64) error {
	_, err := s.call(nodewire.OpUnreserve, &nodewire.Unreserve{IDs: ids})
	return err
}

func (s *session) Commit(reqs []objmap.CommitRequest) error {
	_, err := s.call(nodewire.OpCommit, &nodewire.Commit{Reqs: reqs})
	return err
}

func (s *session) Layout() objmap.Layout { return s.rc.lay }

func (s *session) pin(chain []uint64, skip int, miss *[numMissCauses]int64) *pinned {
	p := &pinned{chain: chain, sess: s}
	m, err := s.call(nodewire.OpPin, &nodewire.Pin{Chain: chain, Skip: skip})
	if err != nil {
		return p // a miss, counted in failed
	}
	r := m.(*nodewire.PinResp)
	p.n, p.id = min(r.N, len(chain)), r.ID
	miss[MissNotFound] += int64(r.NotFound)
	for i := range r.Spans {
		sp := &r.Spans[i]
		if _, err := s.rc.lay.Span(sp.Info.Place(), 0, sp.First, sp.K); err != nil {
			s.rc.failed(fmt.Errorf("%w: run %d: %w", nodewire.ErrProtocol, sp.Info.ID, err))
			break // the prefix ends before a run this store cannot read
		}
		p.runs = append(p.runs, mover.Run{Info: &sp.Info, First: sp.First, K: sp.K, ChainPos: sp.ChainPos})
	}
	return p
}

func (s *session) unpin(p *pinned) {
	if p.id != 0 {
		_, _ = s.call(nodewire.OpUnpin, &nodewire.Unpin{ID: p.id}) // a lost service released it
	}
}

func (s *session) corrupt(p *pinned, i int) bool {
	m, err := s.call(nodewire.OpCorrupt, &nodewire.Corrupt{ID: p.id, Run: i})
	return err == nil && m.(*nodewire.Flag).V
}
