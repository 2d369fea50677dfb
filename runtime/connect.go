package runtime

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/prefix"
	"github.com/tutti-io/tutti/runtime/internal/kvmeta"
	"github.com/tutti-io/tutti/runtime/internal/nodewire"
	"github.com/tutti-io/tutti/runtime/internal/prewrite"
	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

// ErrServiceLost is wrapped by the control calls of a connected store
// whose service went away: its loads are misses and its saves are skipped
// (SkipIOError) until the store has connected again (remoteControl).
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
// Stats has no Index or Map. A lost connection is dialed again in the
// background (remoteControl; Stats.Service). Close closes the connection:
// the service releases whatever the store still held.
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

// remoteControl is the control path of a connected store: its calls go to
// the service over the current session (connect_session.go). When that
// session is lost, calls fail (misses, skipped saves) while the store dials
// again in the background, backing off from ReconnectMinDelay to
// ReconnectMaxDelay; it takes the new session once every load and save of
// the lost one ended, and only if the service serves the same store: the
// same directories, layout and pool files (the very inodes this process
// has open). A service that restarted on other files is refused for good
// (Stats.Service.ReconnectError): the engine must connect again.
type remoteControl struct {
	socket      string
	fingerprint string
	// lay is the service's layout (from its hello): where every run's
	// bytes lie, for this store's own reads and writes.
	lay    objmap.Layout
	hello  nodewire.HelloResp // the first hello: a later one must name the same store
	keeps  atomic.Bool
	files  []*uring.File
	fileID []fileID

	mu       sync.Mutex
	cur      *session
	closed   bool
	dialing  bool
	stop     chan struct{}
	dialDone chan struct{}
	refused  error // why a reconnect was refused for good

	// errs counts control calls that failed (their loads missed, their
	// saves were skipped); lastErr is the last one's.
	errs       atomic.Int64
	lastErr    atomic.Value
	reconnects atomic.Int64
	// dialFails counts redials that found no service (it is not back yet);
	// lastDial is the last one's error.
	dialFails atomic.Int64
	lastDial  atomic.Value
}

// Reconnect pacing: the first retry after a loss, and the longest wait
// between two.
const (
	ReconnectMinDelay = 50 * time.Millisecond
	ReconnectMaxDelay = 5 * time.Second
)

// fileID is a pool file's identity: a service restarted on files made
// anew (same paths, other inodes) is another store.
type fileID struct{ dev, ino uint64 }

// dialService connects to socket and says hello.
func dialService(socket string, cfg Config) (*remoteControl, *nodewire.HelloResp, error) {
	rc := &remoteControl{socket: socket, fingerprint: fingerprint(cfg.Geometry), stop: make(chan struct{})}
	s, h, err := rc.dialSession()
	if err != nil {
		return nil, nil, err
	}
	if rc.lay, err = helloLayout(cfg, h); err != nil {
		s.close()
		return nil, nil, fmt.Errorf("runtime: connect to %s: %w", socket, err)
	}
	rc.hello = *h
	rc.keeps.Store(h.KeepsMeta)
	rc.adopt(s)
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
		var st unix.Stat_t
		if err := unix.Fstat(int(f.FD), &st); err != nil {
			return fmt.Errorf("pool file %s: %w", p, err)
		}
		rc.fileID = append(rc.fileID, fileID{uint64(st.Dev), st.Ino})
	}
	return nil
}

// session is the current session (lost or not).
func (rc *remoteControl) session() *session {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.cur
}

// lost starts dialing again once the current session is lost (unless the
// store closes or a reconnect was refused for good).
func (rc *remoteControl) lost(s *session) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.closed || rc.dialing || rc.refused != nil || s != rc.cur {
		return
	}
	rc.dialing, rc.dialDone = true, make(chan struct{})
	go rc.redial(s, rc.dialDone)
}

// redial dials until a session serves this store again, the store closes,
// or the service turns out to serve another store.
func (rc *remoteControl) redial(old *session, done chan struct{}) {
	defer close(done)
	delay := ReconnectMinDelay
	for {
		select {
		case <-rc.stop:
			rc.endDial(nil)
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, ReconnectMaxDelay)
		if old.io.Load() > 0 {
			continue // the lost session's reads and writes first
		}
		s, h, err := rc.dialSession()
		if err != nil { // the service is not back yet
			rc.dialFails.Add(1)
			rc.lastDial.Store(err.Error())
			continue
		}
		if err := rc.sameStore(h); err != nil {
			s.close()
			rc.endDial(rc.failed(fmt.Errorf("runtime: reconnect to %s refused: %w", rc.socket, err)))
			return
		}
		rc.keeps.Store(h.KeepsMeta)
		rc.endDial(nil)
		if !rc.adopt(s) {
			s.close() // the store closed meanwhile
			return
		}
		rc.reconnects.Add(1)
		return
	}
}

// endDial ends a redial, refused for good if refused is not nil.
func (rc *remoteControl) endDial(refused error) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.dialing = false
	if refused != nil {
		rc.refused = refused
	}
}

// adopt makes s the current session unless the store closed; a session
// lost before it was adopted (its reader found it was not the current
// one) is dialed again now.
func (rc *remoteControl) adopt(s *session) bool {
	rc.mu.Lock()
	if rc.closed {
		rc.mu.Unlock()
		return false
	}
	rc.cur = s
	rc.mu.Unlock()
	s.mu.Lock()
	lost := s.lost != nil
	s.mu.Unlock()
	if lost {
		rc.lost(s)
	}
	return true
}

// sameStore checks that a new hello names the store this one placed its
// bytes by: same directories, layout and pool files, still the inodes
// this process has open.
func (rc *remoteControl) sameStore(h *nodewire.HelloResp) error {
	was := rc.hello
	if !slices.Equal(h.Dirs, was.Dirs) || !slices.Equal(h.Files, was.Files) || h.FilesPerDir != was.FilesPerDir ||
		h.RunWidth != was.RunWidth || h.Buffered != was.Buffered {
		return fmt.Errorf("%w: the service now serves directories %v (%d files each, runs over %d devices), "+
			"this engine connected to %v (%d, %d)", ErrSettingsMismatch, h.Dirs, h.FilesPerDir, h.RunWidth,
			was.Dirs, was.FilesPerDir, was.RunWidth)
	}
	for i, p := range h.Files {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return fmt.Errorf("pool file %s: %w", p, err)
		}
		if (fileID{uint64(st.Dev), st.Ino}) != rc.fileID[i] {
			return fmt.Errorf("%w: pool file %s was made anew since this engine opened it", ErrSettingsMismatch, p)
		}
	}
	return nil
}

// link is Stats.Service.
func (rc *remoteControl) link() ServiceLink {
	l := ServiceLink{Socket: rc.socket, ControlErrors: rc.errs.Load(), Reconnects: rc.reconnects.Load(),
		DialFailures: rc.dialFails.Load()}
	l.LastError, _ = rc.lastErr.Load().(string)
	l.LastDialError, _ = rc.lastDial.Load().(string)
	rc.mu.Lock()
	s := rc.cur
	if rc.refused != nil {
		l.ReconnectError = rc.refused.Error()
	}
	rc.mu.Unlock()
	s.mu.Lock()
	l.Connected = s.lost == nil
	s.mu.Unlock()
	return l
}

// failed counts a failed call and returns its error.
func (rc *remoteControl) failed(err error) error {
	rc.errs.Add(1)
	rc.lastErr.Store(err.Error())
	return err
}

func (rc *remoteControl) close() error {
	rc.mu.Lock()
	rc.closed = true
	close(rc.stop)
	dialing, done, s := rc.dialing, rc.dialDone, rc.cur
	rc.mu.Unlock()
	if dialing {
		<-done
	}
	err := s.conn.Close()
	if errors.Is(err, net.ErrClosed) {
		err = nil // closed already, as a call that failed on it closes it: a loss counted there, not Close's
	}
	<-s.done
	for _, f := range rc.files {
		_ = unix.Close(int(f.FD))
	}
	return err
}

// bind is the session a save's transaction calls (its reservations are
// that connection's), counted in its io until the save ends (Save.finish).
func (rc *remoteControl) bind() *session {
	s := rc.session()
	s.io.Add(1)
	return s
}

// The control interface, over the current session.

func (rc *remoteControl) Lookup(chain []uint64) int { return rc.session().Lookup(chain) }

func (rc *remoteControl) Reserve(chain []uint64, meta []kvmeta.Meta, ready func() error) (int, int, prefix.StopReason, error) {
	return rc.session().Reserve(chain, meta, ready)
}

func (rc *remoteControl) Allocate(n, ways int) ([]objmap.Reservation, error) {
	return rc.session().Allocate(n, ways)
}

func (rc *remoteControl) AllocateOne(k int) (objmap.Reservation, error) {
	return rc.session().AllocateOne(k)
}

func (rc *remoteControl) Abort(r objmap.Reservation) error { return rc.session().Abort(r) }

func (rc *remoteControl) Unreserve(ids []uint64) error { return rc.session().Unreserve(ids) }

func (rc *remoteControl) Commit(reqs []objmap.CommitRequest) error { return rc.session().Commit(reqs) }

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

func (rc *remoteControl) Layout() objmap.Layout { return rc.lay }

func (rc *remoteControl) pin(chain []uint64, skip int, miss *[numMissCauses]int64) *pinned {
	return rc.session().pin(chain, skip, miss)
}

// unpin and corrupt go to the pin's own session.
func (rc *remoteControl) unpin(p *pinned) { p.sess.unpin(p) }

func (rc *remoteControl) corrupt(p *pinned, i int) bool { return p.sess.corrupt(p, i) }

func (rc *remoteControl) discard(id uint64) (int, error) {
	m, err := rc.session().call(nodewire.OpDiscard, &nodewire.Discard{Block: id})
	if err != nil {
		return 0, err
	}
	return m.(*nodewire.Count).N, nil
}

func (rc *remoteControl) resident() []ResidentBlock {
	m, err := rc.session().call(nodewire.OpResident, &nodewire.Resident{})
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

func (rc *remoteControl) keepsMeta() bool { return rc.keeps.Load() }

// servicePool is a connected store's prewrite pool: the service's store
// prewrites, so this one is off and reports nothing written here.
type servicePool struct{}

func (servicePool) Prewrite(int64) (int64, error) { return 0, nil }
func (servicePool) PrewriteLeftBytes() int64      { return 0 }
func (servicePool) PrewrittenBytes() int64        { return 0 }
func (servicePool) PrewriteNote() string          { return "" }
