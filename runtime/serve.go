package runtime

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/kvmeta"
	"github.com/tutti-io/tutti/runtime/internal/nodewire"
	"golang.org/x/sys/unix"
)

// Service is a node's store service (tutti serve): one store, opened here,
// whose control path (index, allocation, commit, eviction, KV events)
// engines on the node share through a unix socket (Connect). Each engine
// moves its own bytes: it opens the pool files itself and reads and writes
// them, the service hands out pins and placements and commits.
//
// A connection owns what it took: its pins, its index reservations and its
// pool reservations. When it closes (the engine closed, or died: the socket
// closes with its process, after the kernel ended the process's io_uring
// requests), the service releases all of them, so a killed engine leaves
// nothing half-committed and nothing pinned.
type Service struct {
	s      *Store
	ctl    *localControl
	ln     *net.UnixListener
	socket string

	mu     sync.Mutex
	peers  map[*peer]struct{}
	closed bool
	wg     sync.WaitGroup
	nextID atomic.Uint64
	stats  serviceCounters
}

// ServiceStats are a service's counters.
type ServiceStats struct {
	Connections int64 `json:"connections"` // engines connected so far
	Live        int   `json:"live"`        // engines connected now
	Requests    int64 `json:"requests"`
	// Refused counts requests refused as malformed or out of turn; a
	// connection that sends one is closed.
	Refused int64 `json:"refused"`
	// ReleasedPins, AbortedRuns and AbortedBlocks are what connections
	// held when they closed: pins released, pool reservations aborted,
	// index reservations (blocks) dropped.
	ReleasedPins  int64 `json:"released_pins"`
	AbortedRuns   int64 `json:"aborted_runs"`
	AbortedBlocks int64 `json:"aborted_blocks"`
}

type serviceCounters struct {
	connections, requests, refused, releasedPins, abortedRuns, abortedBlocks atomic.Int64
}

// Serve opens the store of cfg (as Open does: a directory held by another
// process fails with ErrLocked) and serves it on a unix socket at socket
// (mode 0600: engines of the same user). A socket file left by a service
// that died is replaced; one a live service answers on is refused.
func Serve(cfg Config, socket string) (*Service, error) {
	if socket == "" {
		return nil, fmt.Errorf("runtime: serve: empty socket path: %w", ErrBadRequest)
	}
	// Engines open the pool files by the paths the service names, from
	// their own working directories.
	dirs := make([]string, len(cfg.Dirs))
	for i, d := range cfg.Dirs {
		abs, err := filepath.Abs(d)
		if err != nil {
			return nil, fmt.Errorf("runtime: serve: directory %q: %w", d, err)
		}
		dirs[i] = abs
	}
	cfg.Dirs = dirs
	s, err := Open(cfg)
	if err != nil {
		return nil, err
	}
	ln, err := listenUnix(socket)
	if err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("runtime: serve on %s: %w", socket, err)
	}
	v := &Service{s: s, ctl: s.ctl.(*localControl), ln: ln, socket: socket, peers: make(map[*peer]struct{})}
	v.wg.Add(1)
	go v.accept()
	return v, nil
}

// listenUnix listens at path, replacing a stale socket file.
func listenUnix(path string) (*net.UnixListener, error) {
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return nil, fmt.Errorf("a service already answers on %s", path)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, err
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(true)
	// Engines of the same user only (the process's umask is left alone:
	// other goroutines may be creating files).
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// Store is the service's store (Stats, Recovery, KV events).
func (v *Service) Store() *Store { return v.s }

// Socket is the path engines connect to.
func (v *Service) Socket() string { return v.socket }

// Stats returns the service's counters.
func (v *Service) Stats() ServiceStats {
	v.mu.Lock()
	live := len(v.peers)
	v.mu.Unlock()
	c := &v.stats
	return ServiceStats{Connections: c.connections.Load(), Live: live, Requests: c.requests.Load(), Refused: c.refused.Load(),
		ReleasedPins: c.releasedPins.Load(), AbortedRuns: c.abortedRuns.Load(), AbortedBlocks: c.abortedBlocks.Load()}
}

// Close stops accepting, closes every connection (releasing what each
// held) and closes the store.
func (v *Service) Close() error {
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return ErrClosed
	}
	v.closed = true
	for p := range v.peers {
		_ = p.c.Close()
	}
	v.mu.Unlock()
	err := v.ln.Close()
	v.wg.Wait()
	return errors.Join(err, v.s.Close())
}

func (v *Service) accept() {
	defer v.wg.Done()
	for {
		c, err := v.ln.AcceptUnix()
		if err != nil {
			return // closed
		}
		p := &peer{v: v, c: c, pins: make(map[uint64]*pinned), blocks: make(map[uint64]struct{}),
			runs: make(map[objmap.RunID]objmap.Reservation)}
		p.pid = peerPID(c)
		v.mu.Lock()
		if v.closed {
			v.mu.Unlock()
			c.Close()
			return
		}
		v.peers[p] = struct{}{}
		v.mu.Unlock()
		v.stats.connections.Add(1)
		v.wg.Add(1)
		go p.serve()
	}
}

// peerPID is the connected process's pid (SO_PEERCRED), 0 if unknown: for
// the service's log of who held what.
func peerPID(c *net.UnixConn) int32 {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	var pid int32
	_ = raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = cred.Pid
		}
	})
	return pid
}

// maxPeerRequests bounds a connection's requests in flight: past it the
// service reads no more of its requests until one is answered.
const maxPeerRequests = 1024

// peer is one engine's connection and what it holds.
type peer struct {
	v   *Service
	c   *net.UnixConn
	pid int32
	wmu sync.Mutex // response frames
	ops sync.WaitGroup

	mu     sync.Mutex
	hello  bool
	pins   map[uint64]*pinned
	blocks map[uint64]struct{}                 // index blocks reserved, not committed or dropped
	runs   map[objmap.RunID]objmap.Reservation // pool reservations, not committed or aborted
}

// serve reads requests until the connection closes, handling each on a
// goroutine of its own (a commit's syncs do not hold up another's pins),
// then releases what the connection held.
func (p *peer) serve() {
	defer p.v.wg.Done()
	var buf []byte
	slots := make(chan struct{}, maxPeerRequests)
	for {
		var f nodewire.Frame
		var err error
		f, buf, err = nodewire.ReadFrame(p.c, buf)
		if err != nil {
			if errors.Is(err, nodewire.ErrProtocol) {
				p.v.stats.refused.Add(1)
			}
			break
		}
		p.v.stats.requests.Add(1)
		req, err := nodewire.DecodeRequest(f)
		p.mu.Lock()
		first := !p.hello
		p.mu.Unlock()
		if err == nil && first != (f.Op == nodewire.OpHello) {
			err = fmt.Errorf("%w: op %d out of turn (hello first, once)", nodewire.ErrProtocol, f.Op)
		}
		if err != nil {
			p.v.stats.refused.Add(1)
			p.respond(f.Op, f.ID, nil, err)
			break
		}
		if first {
			resp, herr := p.v.hello(req.(*nodewire.Hello))
			p.respond(f.Op, f.ID, resp, herr)
			if herr != nil {
				break
			}
			p.mu.Lock()
			p.hello = true
			p.mu.Unlock()
			continue
		}
		p.ops.Add(1)
		slots <- struct{}{}
		go func(op nodewire.Op, id uint64, req nodewire.Msg) {
			defer func() { <-slots; p.ops.Done() }()
			resp, err := p.handle(req)
			p.respond(op, id, resp, err)
			if errors.Is(err, nodewire.ErrProtocol) {
				// A request naming what the connection does not hold: the
				// engine's view of its saves is wrong, so end them all.
				p.v.stats.refused.Add(1)
				_ = p.c.Close()
			}
		}(f.Op, f.ID, req)
	}
	_ = p.c.Close()
	p.ops.Wait()
	p.release()
	p.v.mu.Lock()
	delete(p.v.peers, p)
	p.v.mu.Unlock()
}

func (p *peer) respond(op nodewire.Op, id uint64, m nodewire.Msg, err error) {
	b := nodewire.AppendResponse(nil, op, id, m, err)
	p.wmu.Lock()
	defer p.wmu.Unlock()
	_, _ = p.c.Write(b) // a dead peer is noticed by the reader
}

// hello checks an engine's protocol version and geometry and tells it the
// store's files and layout (the engine places every byte by it).
func (v *Service) hello(h *nodewire.Hello) (nodewire.Msg, error) {
	if h.Version != nodewire.Version {
		return nil, fmt.Errorf("%w: protocol version %d, the service speaks %d", nodewire.ErrProtocol, h.Version, nodewire.Version)
	}
	if want := fingerprint(v.s.geo); h.Fingerprint != want {
		return nil, fmt.Errorf("%w: the engine's geometry (fingerprint %s) is not the store's (%s, fingerprint %s)", ErrGeometryMismatch,
			h.Fingerprint, v.s.geo, want)
	}
	lay := v.s.m.Layout()
	r := &nodewire.HelloResp{Dirs: v.s.m.Dirs(), FilesPerDir: lay.FilesPerDir(), RunWidth: lay.Width(), Buffered: v.s.cfg.buffered,
		KeepsMeta: v.ctl.keepsMeta(), CapacityBytes: v.s.cfg.CapacityBytes}
	for _, f := range v.s.m.Files() {
		r.Files = append(r.Files, f.Path)
	}
	return r, nil
}

// release gives up what the closed connection held: pins are released,
// pool reservations aborted, reserved index blocks dropped (one at a time:
// dropping a block drops its pending descendants, which then fail alone).
func (p *peer) release() {
	ctl := p.v.ctl
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, pin := range p.pins {
		ctl.unpin(pin)
		delete(p.pins, id)
		p.v.stats.releasedPins.Add(1)
	}
	for id, r := range p.runs {
		_ = ctl.Abort(r)
		delete(p.runs, id)
		p.v.stats.abortedRuns.Add(1)
	}
	for id := range p.blocks {
		if ctl.Unreserve([]uint64{id}) == nil {
			p.v.stats.abortedBlocks.Add(1)
		}
		delete(p.blocks, id)
	}
}

// handle serves one request of a connection that said hello.
func (p *peer) handle(req nodewire.Msg) (nodewire.Msg, error) {
	ctl := p.v.ctl
	switch r := req.(type) {
	case *nodewire.Lookup:
		return &nodewire.Count{N: ctl.Lookup(r.Chain)}, nil
	case *nodewire.Pin:
		return p.pin(r)
	case *nodewire.Unpin:
		p.mu.Lock()
		pin := p.pins[r.ID]
		delete(p.pins, r.ID)
		p.mu.Unlock()
		if pin == nil {
			return nil, fmt.Errorf("%w: unpin of unknown pin %d", nodewire.ErrProtocol, r.ID)
		}
		ctl.unpin(pin)
		return &nodewire.Empty{}, nil
	case *nodewire.Corrupt:
		p.mu.Lock()
		pin := p.pins[r.ID]
		p.mu.Unlock()
		if pin == nil || r.Run >= len(pin.entries) {
			return nil, fmt.Errorf("%w: run %d of unknown pin %d", nodewire.ErrProtocol, r.Run, r.ID)
		}
		return &nodewire.Flag{V: ctl.corrupt(pin, r.Run)}, nil
	case *nodewire.Discard:
		n, err := ctl.discard(r.Block)
		return &nodewire.Count{N: n}, err
	case *nodewire.Resident:
		out := &nodewire.ResidentResp{}
		for _, b := range ctl.resident() {
			out.Blocks = append(out.Blocks, nodewire.Block(b))
		}
		return out, nil
	case *nodewire.JournalReady:
		return &nodewire.Empty{}, ctl.journalReady()
	}
	return p.handleSave(req)
}

// pin pins for a load or a hold; the pin is the connection's until Unpin.
func (p *peer) pin(r *nodewire.Pin) (nodewire.Msg, error) {
	if r.Skip > len(r.Chain) {
		return nil, fmt.Errorf("%w: skip %d of a %d-block chain", nodewire.ErrProtocol, r.Skip, len(r.Chain))
	}
	var miss [numMissCauses]int64
	pin := p.v.ctl.pin(r.Chain, r.Skip, &miss)
	out := &nodewire.PinResp{N: pin.n, NotFound: int(miss[MissNotFound])}
	if pin.n == 0 {
		return out, nil
	}
	out.ID = p.v.nextID.Add(1)
	for i, run := range pin.runs {
		out.Spans = append(out.Spans, nodewire.Span{Info: pin.entries[i].Info, First: run.First, K: run.K, ChainPos: run.ChainPos})
	}
	p.mu.Lock()
	p.pins[out.ID] = pin
	p.mu.Unlock()
	return out, nil
}

// handleSave serves a save's steps, keeping what the connection holds.
func (p *peer) handleSave(req nodewire.Msg) (nodewire.Msg, error) {
	ctl := p.v.ctl
	switch r := req.(type) {
	case *nodewire.Reserve:
		return p.reserve(r)
	case *nodewire.Allocate:
		if r.Ways < 1 || r.N < 1 || r.N > maxServeBlocks {
			return nil, fmt.Errorf("%w: allocate %d blocks %d ways", nodewire.ErrProtocol, r.N, r.Ways)
		}
		resv, err := ctl.Allocate(r.N, r.Ways)
		p.hold(resv)
		return &nodewire.Reservations{Res: resv}, err
	case *nodewire.AllocateOne:
		if r.K < 1 || r.K > maxServeBlocks {
			return nil, fmt.Errorf("%w: allocate one run of %d blocks", nodewire.ErrProtocol, r.K)
		}
		res, err := ctl.AllocateOne(r.K)
		if err != nil {
			return nil, err
		}
		p.hold([]objmap.Reservation{res})
		return &nodewire.Reservations{Res: []objmap.Reservation{res}}, nil
	case *nodewire.Abort:
		if !p.take(r.Res) {
			return nil, fmt.Errorf("%w: abort of run %d, not this connection's", nodewire.ErrProtocol, r.Res.ID)
		}
		return &nodewire.Empty{}, ctl.Abort(r.Res)
	case *nodewire.Unreserve:
		if err := p.dropBlocks(r.IDs); err != nil {
			return nil, err
		}
		return &nodewire.Empty{}, ctl.Unreserve(r.IDs)
	case *nodewire.Commit:
		return p.commit(r)
	}
	return nil, fmt.Errorf("%w: unexpected request %T", nodewire.ErrProtocol, req)
}

func (p *peer) reserve(r *nodewire.Reserve) (nodewire.Msg, error) {
	ctl := p.v.ctl
	if len(r.Chain) > maxServeBlocks || (len(r.Meta) != 0 && len(r.Meta) != len(r.Chain)) {
		return nil, fmt.Errorf("%w: reserve of %d blocks with %d metadata", nodewire.ErrProtocol, len(r.Chain), len(r.Meta))
	}
	var meta []kvmeta.Meta
	if len(r.Meta) > 0 && ctl.keepsMeta() {
		bm := make([]BlockMeta, len(r.Meta))
		for i, m := range r.Meta {
			bm[i] = BlockMeta{Tokens: m.Tokens, Hash: m.Hash}
		}
		var err error
		if meta, err = p.v.s.copyMeta(r.Chain, bm); err != nil {
			return nil, err
		}
	}
	from, n, stop, err := ctl.Reserve(r.Chain, meta, ctl.journalReady)
	if err != nil {
		return &nodewire.ReserveResp{From: from}, err
	}
	p.mu.Lock()
	for _, id := range r.Chain[from : from+n] {
		p.blocks[id] = struct{}{}
	}
	p.mu.Unlock()
	return &nodewire.ReserveResp{From: from, N: n, Stop: stop}, nil
}

func (p *peer) commit(r *nodewire.Commit) (nodewire.Msg, error) {
	if len(r.Reqs) == 0 || len(r.Reqs) > objmap.MaxCommitBatch {
		return nil, fmt.Errorf("%w: commit of %d runs", nodewire.ErrProtocol, len(r.Reqs))
	}
	p.mu.Lock()
	for _, c := range r.Reqs {
		_, ok := p.runs[c.Res.ID]
		for _, id := range c.Chain {
			_, held := p.blocks[id]
			ok = ok && held
		}
		if !ok || len(c.Chain) != c.Res.Chunks {
			p.mu.Unlock()
			return nil, fmt.Errorf("%w: commit of run %d: not this connection's reservation or blocks", nodewire.ErrProtocol, c.Res.ID)
		}
	}
	for _, c := range r.Reqs {
		delete(p.runs, c.Res.ID) // committed, or aborted by the failed commit
	}
	p.mu.Unlock()
	if err := p.v.ctl.Commit(r.Reqs); err != nil {
		return nil, err // the blocks stay reserved: the engine unreserves them
	}
	p.mu.Lock()
	for _, c := range r.Reqs {
		for _, id := range c.Chain {
			delete(p.blocks, id)
		}
	}
	p.mu.Unlock()
	return &nodewire.Empty{}, nil
}

func (p *peer) hold(resv []objmap.Reservation) {
	p.mu.Lock()
	for _, r := range resv {
		p.runs[r.ID] = r
	}
	p.mu.Unlock()
}

// take reports whether r was the connection's, and forgets it.
func (p *peer) take(r objmap.Reservation) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	held, ok := p.runs[r.ID]
	if ok && held == r {
		delete(p.runs, r.ID)
		return true
	}
	return false
}

// dropBlocks forgets reserved blocks being unreserved; all must be the
// connection's.
func (p *peer) dropBlocks(ids []uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		if _, ok := p.blocks[id]; !ok {
			return fmt.Errorf("%w: unreserve of block %#x, not reserved by this connection", nodewire.ErrProtocol, id)
		}
	}
	for _, id := range ids {
		delete(p.blocks, id)
	}
	return nil
}

// fingerprint is a geometry's on-disk fingerprint as the hello carries it.
func fingerprint(g kvshape.Geometry) string { return fmt.Sprintf("%016x", objmap.Fingerprint(g)) }

// maxServeBlocks bounds a request's blocks (the wire's list bound).
const maxServeBlocks = nodewire.MaxItems
