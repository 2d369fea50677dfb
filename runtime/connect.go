package runtime

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/prefix"
	"github.com/tutti-io/tutti/runtime/internal/kvmeta"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/runtime/internal/nodewire"
	"github.com/tutti-io/tutti/runtime/internal/prewrite"
	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

// ErrServiceLost is wrapped by the control calls of a connected store
// whose service went away: its loads are misses and its saves are skipped
// (SkipIOError) until the engine connects again.
var ErrServiceLost = errors.New("runtime: node service connection lost")

// Connect is Open for an engine on a node whose store is served by a
// Service (tutti serve) at socket: the store's directories, capacity and
// recovery are the service's (cfg.Dirs and cfg.CapacityBytes are taken
// from it and may be left empty), its Geometry must be cfg's, and so is
// its layout (objmap.Layout, sent in the service's hello: the engine
// places every read and write by it; cfg.RunWidth, if set, must match).
// The engine keeps its data path: it opens the pool files itself and
// moves the bytes with its own mover (cfg.Path: its host memory, or its
// GPU's HBM), its own staging, ring and scheduler. Lookup, Load, Save,
// Match and Discard work as on an opened store and see every engine's
// saves; what the service owns is not here: TakeKVEvents and Check return
// errors (the service publishes KV events and registers the node once),
// Stats has no Index or Map. Close closes the connection: the service releases
// whatever the store still held.
func Connect(socket string, cfg Config) (*Store, error) {
	rc, hello, err := dialService(socket, cfg)
	if err != nil {
		return nil, err
	}
	if cfg.RunWidth != 0 && cfg.RunWidth != rc.lay.Width() {
		_ = rc.close()
		return nil, fmt.Errorf("%w: the service's store at %s spreads each run over %d devices, Config.RunWidth asks for %d",
			ErrSettingsMismatch, socket, rc.lay.Width(), cfg.RunWidth)
	}
	cfg.Dirs, cfg.CapacityBytes, cfg.RunWidth, cfg.buffered = hello.Dirs, hello.CapacityBytes, rc.lay.Width(), hello.Buffered
	s, userDevice, err := newStore(cfg, "connect")
	if err != nil {
		_ = rc.close()
		return nil, err
	}
	s.ctl, s.remote = rc, rc
	if err := rc.openFiles(hello.Files, hello.Buffered); err != nil {
		_ = rc.close()
		return nil, fmt.Errorf("runtime: connect: %w", err)
	}
	s.files = rc.files
	if err := s.openIO(userDevice); err != nil {
		_ = errors.Join(s.closeParts()...)
		_ = rc.close()
		return nil, fmt.Errorf("runtime: connect: %w", err)
	}
	s.pre = prewrite.Start(servicePool{}, true, "the node's service prewrites the pool")
	return s, nil
}

// remoteControl is the control path of a connected store: each call is a
// request to the service, answered on the connection's reader goroutine.
type remoteControl struct {
	conn   *net.UnixConn
	socket string
	// lay is the service's layout (from its hello): where every run's
	// bytes lie, for this store's own reads and writes.
	lay     objmap.Layout
	keeps   bool
	files   []*uring.File
	wmu     sync.Mutex
	next    atomic.Uint64
	mu      sync.Mutex
	waiting map[uint64]chan reply
	lost    error
	done    chan struct{}
	// errs counts control calls that failed (their loads missed, their
	// saves were skipped); lastErr is the last one's.
	errs    atomic.Int64
	lastErr atomic.Value
}

type reply struct {
	payload []byte
	err     error
}

// dialService connects to socket and says hello.
func dialService(socket string, cfg Config) (*remoteControl, *nodewire.HelloResp, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return nil, nil, fmt.Errorf("runtime: connect to %s: %w", socket, err)
	}
	rc := &remoteControl{conn: c, socket: socket, waiting: make(map[uint64]chan reply), done: make(chan struct{})}
	go rc.read()
	m, err := rc.call(nodewire.OpHello, &nodewire.Hello{Version: nodewire.Version, Fingerprint: fingerprint(cfg.Geometry)})
	if err != nil {
		_ = rc.close()
		return nil, nil, fmt.Errorf("runtime: connect to %s: %w", socket, err)
	}
	h := m.(*nodewire.HelloResp)
	if rc.lay, err = helloLayout(cfg, h); err != nil {
		_ = rc.close()
		return nil, nil, fmt.Errorf("runtime: connect to %s: %w", socket, err)
	}
	rc.keeps = h.KeepsMeta
	return rc, h, nil
}

// helloLayout is the store's layout as the service's hello gives it: the
// service's own, never one the engine derives (a run width of 0, which
// objmap.NewLayout would choose, is refused), naming exactly the files
// the service sent.
func helloLayout(cfg Config, h *nodewire.HelloResp) (objmap.Layout, error) {
	if len(h.Dirs) == 0 || h.FilesPerDir < 1 || h.RunWidth < 1 {
		return objmap.Layout{}, fmt.Errorf("the service names %d directories of %d files, run width %d: %w",
			len(h.Dirs), h.FilesPerDir, h.RunWidth, nodewire.ErrProtocol)
	}
	lay, err := objmap.NewLayout(cfg.Geometry, len(h.Dirs), h.FilesPerDir, h.RunWidth)
	if err != nil {
		return objmap.Layout{}, fmt.Errorf("the service's layout: %w: %w", nodewire.ErrProtocol, err)
	}
	if lay.Files() != len(h.Files) {
		return objmap.Layout{}, fmt.Errorf("the service names %d pool files, its layout %d: %w", len(h.Files), lay.Files(), nodewire.ErrProtocol)
	}
	return lay, nil
}

// openFiles opens the store's pool files for this process's own I/O.
func (rc *remoteControl) openFiles(paths []string, buffered bool) error {
	flags := unix.O_RDWR
	if !buffered {
		flags |= unix.O_DIRECT
	}
	for _, p := range paths {
		f, err := uring.OpenFile(p, flags, 0)
		if err != nil {
			return fmt.Errorf("opening pool file %s the service named: %w", p, err)
		}
		rc.files = append(rc.files, f)
	}
	return nil
}

// read dispatches responses until the connection fails; then every call
// waiting and every later one fails with ErrServiceLost.
func (rc *remoteControl) read() {
	defer close(rc.done)
	for {
		f, _, err := nodewire.ReadFrame(rc.conn, nil)
		if err == nil {
			rc.mu.Lock()
			ch := rc.waiting[f.ID]
			delete(rc.waiting, f.ID)
			rc.mu.Unlock()
			if ch != nil {
				ch <- reply{payload: f.Payload}
			}
			continue
		}
		rc.mu.Lock()
		rc.lost = fmt.Errorf("%w: %w", ErrServiceLost, err)
		for id, ch := range rc.waiting {
			ch <- reply{err: rc.lost}
			delete(rc.waiting, id)
		}
		rc.mu.Unlock()
		return
	}
}

// call sends req as op and waits for its response.
func (rc *remoteControl) call(op nodewire.Op, req nodewire.Msg) (nodewire.Msg, error) {
	id := rc.next.Add(1)
	ch := make(chan reply, 1)
	rc.mu.Lock()
	if rc.lost != nil {
		err := rc.lost
		rc.mu.Unlock()
		return nil, rc.failed(err)
	}
	rc.waiting[id] = ch
	rc.mu.Unlock()
	e := nodewire.Enc{}
	req.Encode(&e)
	rc.wmu.Lock()
	_, werr := rc.conn.Write(nodewire.AppendFrame(nil, op, id, e.B))
	rc.wmu.Unlock()
	if werr != nil {
		_ = rc.conn.Close() // the reader fails every waiter, this one too
	}
	r := <-ch
	if r.err != nil {
		return nil, rc.failed(r.err)
	}
	m, rerr, err := nodewire.DecodeResponse(op, r.payload)
	if err != nil {
		_ = rc.conn.Close()
		return nil, rc.failed(fmt.Errorf("%w: %w", ErrServiceLost, err))
	}
	if rerr != nil {
		rc.failed(rerr)
	}
	return m, rerr
}

// failed counts a failed call and returns its error.
func (rc *remoteControl) failed(err error) error {
	rc.errs.Add(1)
	rc.lastErr.Store(err.Error())
	return err
}

func (rc *remoteControl) close() error {
	err := rc.conn.Close()
	<-rc.done
	for _, f := range rc.files {
		_ = unix.Close(int(f.FD))
	}
	return err
}

func (rc *remoteControl) Lookup(chain []uint64) int {
	m, err := rc.call(nodewire.OpLookup, &nodewire.Lookup{Chain: chain})
	if err != nil {
		return 0 // a miss, counted in failed
	}
	return min(m.(*nodewire.Count).N, len(chain))
}

// Reserve leaves ready to the service, which checks its own journal.
func (rc *remoteControl) Reserve(chain []uint64, meta []kvmeta.Meta, _ func() error) (int, int, prefix.StopReason, error) {
	req := &nodewire.Reserve{Chain: chain}
	for _, x := range meta {
		req.Meta = append(req.Meta, nodewire.Meta(x))
	}
	m, err := rc.call(nodewire.OpReserve, req)
	r, _ := m.(*nodewire.ReserveResp)
	if r == nil {
		return 0, 0, 0, err
	}
	if r.From > len(chain) || r.N > len(chain)-r.From {
		return 0, 0, 0, rc.failed(fmt.Errorf("%w: reserved %d blocks after %d of %d", nodewire.ErrProtocol, r.N, r.From, len(chain)))
	}
	return r.From, r.N, r.Stop, err
}

func (rc *remoteControl) Allocate(n, ways int) ([]objmap.Reservation, error) {
	m, err := rc.call(nodewire.OpAllocate, &nodewire.Allocate{N: n, Ways: ways})
	if m == nil {
		return nil, err
	}
	return rc.checkRes(m.(*nodewire.Reservations).Res, err)
}

func (rc *remoteControl) AllocateOne(k int) (objmap.Reservation, error) {
	m, err := rc.call(nodewire.OpAllocateOne, &nodewire.AllocateOne{K: k})
	if err != nil {
		return objmap.Reservation{}, err
	}
	res, err := rc.checkRes(m.(*nodewire.Reservations).Res, nil)
	if err != nil || len(res) != 1 || res[0].Chunks != k {
		return objmap.Reservation{}, rc.failed(fmt.Errorf("%w: one run of %d blocks asked, %d runs given (%v)", nodewire.ErrProtocol, k, len(res), err))
	}
	return res[0], nil
}

// checkRes fails closed on a reservation the layout cannot place (a file
// this store does not have, a misaligned offset, a bad chunk count).
func (rc *remoteControl) checkRes(res []objmap.Reservation, err error) ([]objmap.Reservation, error) {
	for _, r := range res {
		if _, perr := rc.lay.Where(r.Place(), 0, 0); perr != nil {
			return nil, rc.failed(fmt.Errorf("%w: reservation %d: %w", nodewire.ErrProtocol, r.ID, perr))
		}
	}
	return res, err
}

func (rc *remoteControl) Abort(r objmap.Reservation) error {
	_, err := rc.call(nodewire.OpAbort, &nodewire.Abort{Res: r})
	return err
}

func (rc *remoteControl) Unreserve(ids []uint64) error {
	_, err := rc.call(nodewire.OpUnreserve, &nodewire.Unreserve{IDs: ids})
	return err
}

func (rc *remoteControl) Commit(reqs []objmap.CommitRequest) error {
	_, err := rc.call(nodewire.OpCommit, &nodewire.Commit{Reqs: reqs})
	return err
}

func (rc *remoteControl) Layout() objmap.Layout { return rc.lay }

func (rc *remoteControl) pin(chain []uint64, skip int, miss *[numMissCauses]int64) *pinned {
	p := &pinned{chain: chain}
	m, err := rc.call(nodewire.OpPin, &nodewire.Pin{Chain: chain, Skip: skip})
	if err != nil {
		return p // a miss, counted in failed
	}
	r := m.(*nodewire.PinResp)
	p.n, p.id = min(r.N, len(chain)), r.ID
	miss[MissNotFound] += int64(r.NotFound)
	for i := range r.Spans {
		sp := &r.Spans[i]
		if _, err := rc.lay.Span(sp.Info.Place(), 0, sp.First, sp.K); err != nil {
			rc.failed(fmt.Errorf("%w: run %d: %w", nodewire.ErrProtocol, sp.Info.ID, err))
			break // the prefix ends before a run this store cannot read
		}
		p.runs = append(p.runs, mover.Run{Info: &sp.Info, First: sp.First, K: sp.K, ChainPos: sp.ChainPos})
	}
	return p
}

func (rc *remoteControl) unpin(p *pinned) {
	if p.id != 0 {
		_, _ = rc.call(nodewire.OpUnpin, &nodewire.Unpin{ID: p.id}) // a lost service released it
	}
}

func (rc *remoteControl) corrupt(p *pinned, i int) bool {
	m, err := rc.call(nodewire.OpCorrupt, &nodewire.Corrupt{ID: p.id, Run: i})
	return err == nil && m.(*nodewire.Flag).V
}

func (rc *remoteControl) discard(id uint64) (int, error) {
	m, err := rc.call(nodewire.OpDiscard, &nodewire.Discard{Block: id})
	if err != nil {
		return 0, err
	}
	return m.(*nodewire.Count).N, nil
}

func (rc *remoteControl) resident() []ResidentBlock {
	m, err := rc.call(nodewire.OpResident, &nodewire.Resident{})
	if err != nil {
		return nil
	}
	bs := m.(*nodewire.ResidentResp).Blocks
	out := make([]ResidentBlock, len(bs))
	for i, b := range bs {
		out[i] = ResidentBlock(b)
	}
	return out
}

// journalReady: the service checks its journal when a save reserves.
func (rc *remoteControl) journalReady() error { return nil }

func (rc *remoteControl) keepsMeta() bool { return rc.keeps }

// servicePool is a connected store's prewrite pool: the service's store
// prewrites, so this one is off and reports nothing written here.
type servicePool struct{}

func (servicePool) Prewrite(int64) (int64, error) { return 0, nil }
func (servicePool) PrewriteLeftBytes() int64      { return 0 }
func (servicePool) PrewrittenBytes() int64        { return 0 }
func (servicePool) PrewriteNote() string          { return "" }
