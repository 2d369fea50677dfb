// Package mover is the seam between a store and whoever moves its bytes
// between the pool files and the engine's KV memory. A store has one Mover,
// chosen by its Config.Path: package cpu submits io_uring reads from Go into
// host KV pages (verifying every chunk's CRC32C), package gpu has the GPU
// drive its own ring and scatter into HBM. A Load hands its planned reads to
// the mover (Restore) and hears back per layer and per failed run (Loader);
// a Save's writes are gathered from the KV memory by the mover's Gatherers
// and written from staging (or, on PathCPU, from the pages themselves).
//
// What the store keeps for itself, whichever mover runs: the index and its
// pins, the scheduler's plan, which blocks a load restored (Loader.Fail turns
// a run and every later one into a miss), and every commit.
package mover

import (
	"fmt"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/ring"
	"github.com/tutti-io/tutti/sched"
	"github.com/tutti-io/tutti/uring"
)

// Mover moves one store's bytes. Bind comes first, once; then Restore and
// NewGatherer may be called concurrently; Close comes last, once every
// restore ended and every gatherer was closed.
type Mover interface {
	// Bind takes the engine's KV memory: the regions of the store's layout
	// (one per layer, or one cross-layer tensor), checked and cut to the
	// length the store's pages need. They stay the engine's and must stay
	// valid until Close.
	Bind(kv []Region) error
	// Cut is how many of the cached leading blocks of runs one restore
	// takes (the rest is recomputed, like blocks the plan leaves out);
	// cached is their total.
	Cut(runs []Run, cached int) int
	// Whole reports whether a restore is one scheduler job that holds its
	// devices' reads until its layers are done (sched.LoadRequest.Whole and
	// SegmentsOnly), rather than reads the mover issues one by one.
	Whole() bool
	// Restore starts r and returns at once; r.Load hears of its progress
	// and its end (Loader). The returned StreamWaiter is nil where the
	// mover's restores offer none (the host waits on PathCPU).
	Restore(r *Restore) StreamWaiter
	// NewGatherer makes the gatherer of one save write buffer: buf is its
	// staging memory (at addr, off-heap), kept by the caller.
	NewGatherer(buf []byte, addr uintptr) Gatherer
	// SaveSlots is how many of the store's staging slots its saves may hold
	// at once: the rest stage this mover's restores.
	SaveSlots(slots int) int
	Close() error
}

// Region is a span of the engine's memory by address and length.
type Region struct {
	Addr     uintptr
	LenBytes int64
}

// Run is one run of a restore: chunks [First, First+K) of the committed run
// Info (wherever the store's Pool puts each layer of it) are restored into
// the pages of block table positions [ChainPos, ChainPos+K).
type Run struct {
	Info     *objmap.RunInfo
	First, K int
	ChainPos int
}

// Pool is where a store's runs lie: objmap's Layout (the one home of
// placement) and the pool files it names (objmap.Map.Files, registered
// with the store's ring). Movers and the save pipeline ask it for every
// offset they read or write.
type Pool struct {
	Layout objmap.Layout
	Files  []*uring.File
}

// Span is the one read of layer layer of run r (its chunks [r.First,
// r.First+r.K)) and the pool file it reads. The store restores only runs
// inside their extents, so an error here is a runtime bug.
func (p Pool) Span(r Run, layer int) (objmap.Span, *uring.File) {
	sp, err := p.Layout.Span(r.Info.Place(), layer, r.First, r.K)
	if err != nil {
		panic(fmt.Sprintf("mover: span of run %d layer %d chunks [%d,+%d): %v", r.Info.ID, layer, r.First, r.K, err))
	}
	return sp, p.Files[sp.File]
}

// Object is where chunk chunk of layer layer of run r lies, with its pool
// file (panics as Span).
func (p Pool) Object(r Run, layer, chunk int) (objmap.Location, *uring.File) {
	return p.At(r.Info.Place(), layer, chunk)
}

// At is where chunk chunk of layer layer of the run at place lies (a
// committed run or a save's reservation), with its pool file; it panics
// as Span.
func (p Pool) At(place objmap.Place, layer, chunk int) (objmap.Location, *uring.File) {
	loc, err := p.Layout.Where(place, layer, chunk)
	if err != nil {
		panic(fmt.Sprintf("mover: run at %+v layer %d chunk %d: %v", place, layer, chunk, err))
	}
	return loc, p.Files[loc.File]
}

// Restore is one load's restore as its mover sees it. The mover reads it,
// never changes it.
type Restore struct {
	Runs []Run
	// Pages is the load's block table: the engine's page j of block i is
	// Pages[i*ChunkPages+j], i counted in block table positions. It is the
	// engine's, unchanged until Done.
	Pages []int32
	// Plan is the scheduler's plan of the runs (its reads, or one
	// IORestore when Whole); IOs is where the scheduler routes them, with
	// room for every one. Every I/O routed must be retired in the scheduler
	// before Done.
	Plan sched.Plan
	IOs  <-chan sched.IO
	Load Loader
}

// Loader is the load a restore reports to. Its methods are safe for
// concurrent use and do not block for long.
type Loader interface {
	// LayersDone says layers [0, n) are in the KV memory; n only grows.
	LayersDone(n int)
	// Fail turns run i and every later run into a miss: their pages hold
	// unspecified bytes. why says what failed (kept for Load.Failure).
	Fail(i int, cause Miss, why error)
	// Valid reports whether run i is still good: reads of a failed run
	// need not be made.
	Valid(i int) bool
	// Corrupt says run i's payload failed its CRC on disk: the store takes
	// it out of service, whether or not the restore failed the run already.
	Corrupt(i int)
	// Done ends the restore, once: every layer is done or the restore
	// failed, every routed I/O is retired, and nothing touches the pages
	// any more.
	Done(Result)
}

// Result is what a restore did, reported with Done.
type Result struct {
	IOs, SplitIOs, OverreadBytes int64
	// Err is about the restore as a whole (the load's Wait returns it);
	// nil when only runs failed.
	Err error
}

// Miss says why a restore lost a run.
type Miss uint8

const (
	MissIOError   Miss = iota // a read failed
	MissShortRead             // a read returned fewer bytes than it asked for
	MissCRC                   // a chunk did not match its CRC32C
	MissClosed                // the store was closing
	MissGPU                   // the GPU refused or failed the restore as a whole
)

// StreamWaiter is what a GPU restore offers beyond its layer reports.
type StreamWaiter interface {
	// StreamWaitLayer makes a CUDA stream wait until layer is in the KV
	// memory, with no host round trip; see Load.StreamWaitLayer.
	StreamWaitLayer(layer int, stream uintptr) error
}

// Write is one save write as a Gatherer sees it: the bytes [Off, Off+Bytes)
// of Layer's object of a run of Chunks chunks, written at FileOff of File
// (where the store's Pool puts that layer).
type Write struct {
	Layer      int
	Off, Bytes int64
	// IOBytes is Bytes rounded up to O_DIRECT blocks: what is written, the
	// bytes after Bytes zero.
	IOBytes int64
	Chunks  int
	// Pages are the engine's pages of the run from its first chunk: page p
	// of the run is Pages[p]. The engine's, unchanged until the save's
	// Gathered.
	Pages []int32
	// AfterEvent, if not 0 (GPU movers only), is a CUDA event of the
	// engine's after which Pages hold the KV to write: the gather's copies
	// wait for it on the device, not on the host.
	AfterEvent uintptr
	File       *uring.File
	FileOff    uint64
	// Parts is where Gather puts the CRC32C of each chunk piece the write
	// covers (Piece.Idx counted over the run's chunk table).
	Parts []Piece
}

// Gatherer gathers save writes through one write buffer. A write buffer
// stages one write at a time.
type Gatherer interface {
	// Gather checksums w's bytes into w.Parts and prepares req (req.C) to
	// write w.IOBytes at w.FileOff: from the buffer, the bytes gathered
	// into it and the padding zeroed, or (direct) from the engine's pages
	// themselves, which the write then reads until it completes. The
	// caller submits req. On an error nothing is prepared.
	Gather(w *Write, req *ring.Req) (direct bool, err error)
	// Close frees what the gatherer holds (after its last write completed).
	Close() error
}
