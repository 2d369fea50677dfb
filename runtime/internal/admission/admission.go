// Package admission is a save's reservations as one transaction. A save
// holds three kinds at once: its blocks in the prefix index (pending, so no
// other save takes them and no load finds them), pool space in the object
// map (one reservation per run), and the scheduler's admission of each
// run's writes (within its budgets and the save bound). Admit takes what
// each can give, leading blocks first, and gives up the rest; writes then
// complete run by run, and Settle commits runs in chain order (a block only
// after its parent) or gives them up.
//
// Every run is in one state (State): Writing while its writes may go to
// disk; Failed once one of them failed (given up when its turn comes in
// chain order); Draining once given up while a write of it may still be in
// flight (its pool reservation is aborted once none is); Committed or
// Aborted at the end. Giving up has one path, giveUp: runs i and after
// leave the index in one step (a block's pending descendants go with it),
// their pool reservations are aborted (now, or once Draining ends), and
// their blocks are counted by cause.
package admission

import (
	"errors"
	"fmt"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/prefix"
	"github.com/tutti-io/tutti/runtime/internal/iosched"
	"github.com/tutti-io/tutti/runtime/internal/kvmeta"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/sched"
)

// Cause says why blocks of a save were not stored (runtime.SkipCause names
// them for the engine).
type Cause uint8

const (
	Cached  Cause = iota // already cached, being saved by another save, or its parent left the index
	NoSpace              // the index or the pool had no room
	Budget               // the scheduler's pending save bytes or op table cut the save
	Bound                // the device cannot write more within the save bound
	Failure              // a write, sync, commit or journal append failed (the error says which)
)

// Store is what a transaction works with: the store's parts, shared.
type Store struct {
	// Ctl is the control path (index, catalog, pool): Local, or a node
	// service's over its socket.
	Ctl   Control
	Sched *iosched.Scheduler
	Geo   kvshape.Geometry
	Dirs  int
	// MaxWriteIOBytes is the scheduler's largest save write.
	MaxWriteIOBytes int64
}

// Events are what a transaction tells its save; both are called on the
// goroutine that called Admit or Settle.
type Events struct {
	// Skip counts blocks not stored for cause (err: the failure, for
	// Failure); blocks may be 0.
	Skip func(cause Cause, blocks int, err error)
	// Saved counts blocks committed and served.
	Saved func(blocks int)
}

// State is a run's place in the transaction.
type State uint8

const (
	Writing   State = iota // its writes go to disk; committed once they all completed
	Failed                 // a write failed: given up in its turn, writes left retired without I/O
	Draining               // given up with a write maybe in flight: its pool reservation waits for it
	Committed              // served
	Aborted                // given up, every reservation released
)

// Run is one run of a save: chain positions [ChainPos, ChainPos+blocks)
// reserved in the index, written into pool reservation Res (when held).
type Run struct {
	Res      objmap.Reservation
	ReqID    uint64 // the scheduler's request (0: none)
	ChainPos int
	Writes   int // writes the scheduler routes for it
	blocks   int // index blocks it holds: Res.Chunks, but where admission cut it
	state    State
	held     bool // it holds Res in the pool
	gathers  bool // its writes count toward the save's Gathered (admitted)
	err      error
	crcs     []uint32      // CRC32C per (layer, chunk), layer-major: objmap's chunk table
	parts    []mover.Piece // the completed writes' chunk pieces, folded into crcs at commit
	// remaining writes not retired; inflight writes being gathered or
	// written.
	remaining, inflight int
}

// Txn is one save's transaction. Its methods are called from the save's
// driver goroutine only, but Target, which a stage worker may call at any
// time (it reads what no state change touches).
type Txn struct {
	st      *Store
	ev      Events
	chain   []uint64
	runs    []*Run
	ios     chan sched.IO
	writing bool // Admit returned: the save's writes may be in flight
	next    int  // first run not settled
}

// Admit reserves what it can of the blocks of chain not cached yet (meta:
// their KV-event metadata, SaveWithMeta's; nil: none), allocates pool runs
// for them, has the scheduler admit each run's writes and routes them to
// IOs. What any of the three cannot take is given up at once and counted.
// journal is the object map's state (journalReady): nil, or why nothing can
// commit, in which case nothing is reserved.
func Admit(st *Store, chain []uint64, meta []kvmeta.Meta, journal func() error, ev Events) *Txn {
	t := &Txn{st: st, ev: ev, chain: chain}
	defer func() { t.writing = true }()
	from, n, stop, err := st.Ctl.Reserve(chain, meta, journal)
	ev.Skip(Cached, from, nil)
	if err != nil { // the journal's state, a lost service (or bad arguments, which the store's checks exclude)
		ev.Skip(Failure, len(chain)-from, err)
		return t
	}
	rest := len(chain) - from - n
	switch stop {
	case prefix.StopCapacity, prefix.StopMaxBlocks:
		ev.Skip(NoSpace, rest, nil)
	default:
		ev.Skip(Cached, rest, nil)
	}
	if n > 0 {
		t.admit(from, n)
	}
	return t
}

// admit allocates runs for the n blocks reserved from chain position from
// and enqueues their writes; whatever the pool or the scheduler cannot take
// it gives up.
func (t *Txn) admit(from, n int) {
	st := t.st
	resv, err := t.allocate(n)
	if err != nil {
		t.runs = append(t.runs, &Run{ChainPos: from, blocks: n})
		if errors.Is(err, objmap.ErrNoSpace) {
			t.giveUp(0, NoSpace, nil) // the pool is full: an admission shortfall, not a failed write
		} else {
			t.giveUp(0, Failure, err)
		}
		return
	}
	// Room for every write the scheduler can dispatch, so routing never
	// blocks.
	bound := 0
	for _, r := range resv {
		bound += st.Geo.Layers * int((objmap.ObjectBytes(st.Geo, r.Chunks)+st.MaxWriteIOBytes-1)/st.MaxWriteIOBytes)
	}
	t.ios = make(chan sched.IO, max(1, bound))
	pos, total := from, 0
	cut := -1          // the first run not admitted whole
	cutCause := Budget // why the scheduler cut the save
	for _, r := range resv {
		sr := &Run{Res: r, ChainPos: pos, blocks: r.Chunks, held: true, crcs: make([]uint32, st.Geo.Layers*r.Chunks)}
		pos += r.Chunks
		total += r.Chunks
		t.runs = append(t.runs, sr)
		if cut >= 0 {
			continue
		}
		lay := st.Ctl.Layout()
		id, tk, err := st.Sched.EnqueueSave(sched.SaveRequest{Device: lay.Device(r.File), LayerDevices: lay.LayerDevices(r.File),
			Blocks: r.Chunks, BytesPerLayerPerBlock: st.Geo.ChunkBytesPerLayer()}, t.ios)
		if err != nil {
			panic(fmt.Sprintf("admission: enqueueing a save: %v", err)) // only bad arguments
		}
		sr.ReqID, sr.Writes, sr.remaining = id, tk.Writes, tk.Writes
		if tk.Blocks == r.Chunks {
			sr.gathers = true
			continue
		}
		// A run's layout depends on its chunk count: a run the scheduler
		// cut is reallocated for the blocks it admitted (its writes are cut
		// for that many), or not written at all; nothing after it is.
		cut = len(t.runs) - 1
		if tk.Reason == sched.ReasonSaveBound {
			cutCause = Bound
		}
		if tk.Blocks > 0 && t.shrink(sr, tk.Blocks) {
			sr.gathers = true
			// Its tail holds index blocks only, given up with what follows.
			t.runs = append(t.runs, &Run{ChainPos: sr.ChainPos + tk.Blocks, blocks: r.Chunks - tk.Blocks})
			cut++
		}
	}
	if total < n {
		// The pool had less room than the index: the chain's end goes
		// first, as it hangs below everything else.
		t.runs = append(t.runs, &Run{ChainPos: from + total, blocks: n - total})
		t.giveUp(len(t.runs)-1, NoSpace, nil)
	}
	if cut >= 0 {
		t.giveUp(cut, cutCause, nil)
	}
}

// shrink replaces sr's reservation by one of k chunks (k < its chunks),
// for a run the scheduler admitted in part. On false sr is not to be
// written; it may hold no reservation any more.
func (t *Txn) shrink(sr *Run, k int) bool {
	ctl := t.st.Ctl
	if err := ctl.Abort(sr.Res); err != nil {
		return false
	}
	sr.held = false
	got, err := ctl.AllocateOne(k)
	if err != nil {
		return false
	}
	sr.Res, sr.held, sr.blocks = got, true, k
	sr.crcs = sr.crcs[:t.st.Geo.Layers*k]
	return true
}

// allocate reserves pool space for n blocks (objmap cuts it into runs of at
// most MaxRunChunks); a shortfall returns what fit (partial admission).
// Where the pool has less room than the index had, the control path makes
// frees durable and evicts first (Local.Allocate).
func (t *Txn) allocate(n int) ([]objmap.Reservation, error) {
	return t.st.Ctl.Allocate(n, t.st.saveWays(n))
}

// reservedChunks is the blocks a set of reservations holds.
func reservedChunks(resv []objmap.Reservation) int {
	n := 0
	for _, r := range resv {
		n += r.Chunks
	}
	return n
}

// minStripeLayerBytes is the smallest per-layer object a save is cut into
// runs for: a restore reads each (layer, run) with one read, which must stay
// large for the devices to run at their rate.
const minStripeLayerBytes = 1 << 20

// saveWays is how many runs a save of chunks blocks is cut into: one per
// directory, fewer when the runs' per-layer objects would fall below
// minStripeLayerBytes. Each run spreads its layers over the devices
// (objmap.Layout) and consecutive runs start on consecutive devices, so
// every layer of a restore of several runs reads from several devices at
// once: layers arrive one after another rather than Width at a time (the
// GPU path's window of reads in flight, which spans a few layers, then
// holds every device), and where a run lies on one device (a store of run
// width 1) a save in one run would move at one device's rate.
func (st *Store) saveWays(chunks int) int {
	byBytes := int64(chunks) * st.Geo.ChunkBytesPerLayer() / minStripeLayerBytes
	return int(max(1, min(int64(st.Dirs), int64(chunks), byBytes)))
}

// ready reports whether no write of run i is queued or in flight: before
// the save's writes start, none is.
func (t *Txn) ready(i int) bool {
	r := t.runs[i]
	return !t.writing || (r.remaining == 0 && r.inflight == 0)
}

// giveUp gives up runs[i:] that are not settled or given up already: their
// index blocks leave at once, in one step (nothing of them is ever
// served), their pool reservations are aborted now or, while a write of
// theirs may be in flight, once none is (Draining), and their blocks are
// counted for cause.
func (t *Txn) giveUp(i int, cause Cause, err error) {
	var ids []uint64
	blocks := 0
	for j := i; j < len(t.runs); j++ {
		r := t.runs[j]
		if r.state == Committed || r.state == Aborted || r.state == Draining {
			continue
		}
		ids = append(ids, t.chain[r.ChainPos:r.ChainPos+r.blocks]...)
		blocks += r.blocks
		switch {
		case !r.held:
			r.state = Aborted
		case t.ready(j):
			_ = t.st.Ctl.Abort(r.Res)
			r.held, r.state = false, Aborted
		default:
			r.state = Draining
		}
	}
	if len(ids) > 0 {
		// Locally only a bug fails it; a lost service released the
		// connection's reservations itself.
		if aerr := t.st.Ctl.Unreserve(ids); aerr != nil && isLocal(t.st.Ctl) {
			panic(fmt.Sprintf("admission: aborting a save's reservation: %v", aerr))
		}
	}
	t.ev.Skip(cause, blocks, err)
}

func isLocal(c Control) bool { _, ok := c.(*Local); return ok }
