// Package harness replays a Mooncake-format trace through every KV-cache
// backend on the same request stream, the same storage capacity and the same
// eviction policy, and measures what each costs.
//
// # How a replay works
//
// Requests are processed in arrival order, one at a time, on one goroutine
// (backends may parallelise inside a request: the I/O of one restore is many
// reads in flight). For each request the driver
//
//  1. asks the shared prefix cache (Index; leaf-first LRU over a block
//     capacity) how many leading chain blocks are cached — or the backend
//     itself when it keeps its own index (SelfIndexed, e.g. tutti's store);
//  2. gives the request pages of the engine's paged KV memory (KVMemory,
//     vLLM's per-layer layout, off-heap) and calls Backend.Restore for the
//     cached blocks, timing each layer's readiness;
//  3. verifies every restored page bit for bit (internal/kvdata);
//  4. writes the KV of the missed blocks into their pages as the prefill would
//     (internal/kvdata) and calls Backend.Save, then evicts what the cache policy
//     drops (Backend.Evict).
//
// Restore and save durations are measured for real; the prefill's layer
// times are measured on the GPU where one is (GPUCompute: cuBLAS GEMMs sized
// from the profile's FLOPs, running next to the restore), else they come
// from a compute model (sched's, from the profile's FLOPs; labelled
// "simulated").
// Time-to-first-token comes from a deterministic timeline (Simulate) that
// honours the arrival times: the GPU runs one prefill at a time, layer l
// starting when layer l is loaded and layer l−1 computed; the device serves
// loads first, in arrival order, and saves in its idle time (yielding
// between blocks). The same measured service times replayed at scaled
// arrival rates give SLO attainment against request rate (Sweep).
//
// Every backend starts its window from an empty store, or, with Config.Warm
// (replay --warm-ms), warm: before the window, untimed and outside every
// metric, the blocks of the trace's earlier requests that the window
// references are saved through the same index and the backend's own Save
// (warm.go), so a short window of a multi-turn trace sees the reuse a
// running server would.
//
// Backends: tutti-cpu and tutti-gpu (runtime package; the GPU path reports
// itself unavailable until the runtime wires it), per-block (one O_DIRECT
// io_uring I/O per page and layer), cufile (O_DIRECT bounce stand-in for
// cuFile's POSIX mode, one file per chunk), pagecache (LMCache-style file per
// chunk through the page cache), dram (host memory, the upper bound) and
// recompute (no cache).
package harness

import (
	"errors"
	"time"

	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/internal/trace"
	"github.com/tutti-io/tutti/kvshape"
)

// ErrUnavailable is wrapped by Backend.Available when this machine cannot run
// the backend (no GPU, no runtime, no cuFile).
var ErrUnavailable = errors.New("backend unavailable on this machine")

// Env is what a backend gets at Open: the shape, where to store, how much.
type Env struct {
	Profile  model.Profile
	Geometry kvshape.Geometry
	// Dirs are this backend's own directories, one per store root
	// (Config.Dirs: root/<backend>), empty at Open; the backend owns its
	// files there and spreads them over every one, so each backend sees the
	// same aggregate devices. Dir is Dirs[0].
	Dirs []string
	Dir  string
	// CapacityBlocks is the storage capacity in chain blocks (the same for
	// every backend); the shared Index evicts beyond it. A backend that keeps
	// its own index gets CapacityBytes = CapacityBlocks * Geometry.ChunkBytes().
	CapacityBlocks int
	CapacityBytes  int64
	// KV is the engine's paged KV memory the backend restores into and saves
	// from.
	KV *KVMemory
	// QueueDepth bounds I/Os in flight for backends that submit asynchronously.
	QueueDepth int
}

// Request is one request as a backend sees it.
type Request struct {
	Seq   int           // 0-based position in the replay
	Trace trace.Request // as parsed
	Chain []uint64      // chain block ids (Trace.HashIDs)
	// Pages are the engine page ids of the request, ChunkPages per chain
	// block: block b's pages are Pages[b*ChunkPages : (b+1)*ChunkPages].
	Pages []int32
	// Hit is the number of leading blocks to restore (Restore) or already
	// present (Save stores Chain[Hit:SaveEnd]).
	Hit int
	// SaveEnd bounds Save: blocks Chain[Hit:SaveEnd] are new and admitted.
	SaveEnd int
}

// BlockPages returns the pages of chain block b.
func (r *Request) BlockPages(chunkPages, b int) []int32 {
	return r.Pages[b*chunkPages : (b+1)*chunkPages]
}

// RestoreResult describes one Restore.
type RestoreResult struct {
	// Blocks is how many leading blocks were restored (≤ Hit). Fewer means
	// the rest became a miss (recomputed): counted in Fallbacks.
	Blocks int
	// LayerReady[l] is when layer l of the restored blocks was in KV memory,
	// measured from the start of Restore. Layer-wise backends fill it layer
	// by layer; chunk-wise ones set every layer to the end.
	LayerReady []time.Duration
	Bytes      int64 // payload bytes restored into KV memory
	// ReadBytes is what the backend read from its storage to restore them
	// (padding, bounce strides, whole objects read to verify a CRC): the
	// read amplification is ReadBytes / Bytes.
	ReadBytes int64
	// ReadBytesPerDir is ReadBytes by Env.Dirs entry (nil where the backend
	// reads no directory: the DRAM tier): how evenly the restore spread
	// over the devices.
	ReadBytesPerDir []int64
	IOs             int64 // read operations issued
	Runs            int   // contiguous stored spans read (files, runs, slots)
	Fallbacks       int   // I/O errors turned into recompute
}

// SaveResult describes one Save.
type SaveResult struct {
	Blocks    int   // blocks stored
	Bytes     int64 // payload bytes written
	IOs       int64
	Fallbacks int // blocks not stored (error, no space, a save budget or bound cut): counted, never silent
}

// Backend is one way to keep and restore KV cache. A backend is used by one
// goroutine; calls come in the order Open, (Restore, Save, Evict)*, Close.
type Backend interface {
	// Name is the --backends name.
	Name() string
	// Available returns nil when this machine can run the backend, or an
	// error wrapping ErrUnavailable that says why.
	Available() error
	// Open prepares the backend; env stays valid until Close.
	Open(env Env) error
	// Restore loads Chain[:Hit] into the request's pages. The result's
	// Blocks may be fewer than Hit (partial: the rest is recomputed).
	Restore(req *Request) (RestoreResult, error)
	// Save stores Chain[Hit:SaveEnd] from the request's pages. When Save
	// returns the pages may be reused.
	Save(req *Request) (SaveResult, error)
	// Evict drops blocks the shared cache policy evicted.
	Evict(ids []uint64) error
	// Close releases everything; files in Env.Dir may stay.
	Close() error
}

// SelfIndexed is a backend that keeps its own prefix index and capacity
// (tutti's store): the driver asks it instead of the shared Index, and it
// evicts on its own.
type SelfIndexed interface {
	// Lookup returns how many leading blocks of chain it can restore.
	Lookup(chain []uint64) int
}

// Labeler is an optional interface for a note printed with the backend's
// results (e.g. "POSIX bounce stand-in: cuFile refused the disk").
type Labeler interface{ Label() string }

// HostSyncer is a backend whose restores may land in other memory than the
// harness's host KV memory (tutti-gpu: HBM). The driver calls ToHost after a
// timed Restore, before verifying, and FromHost before a timed Save, after
// filling the pages: the copies are outside the measured windows. When
// OwnMemory says the restores land in the backend's own memory, the driver
// calls Invalidate before a timed Restore instead of zeroing the host pages:
// the backend's copy of those pages must then hold no block, so a restore
// that writes nothing cannot pass verification with a block left there
// earlier (ToHost overwrites every host page that is verified). Otherwise
// the driver zeroes the host pages and Invalidate is not called.
type HostSyncer interface {
	OwnMemory() bool                       // restores land in the backend's memory, not the host pages
	Invalidate(req *Request) error         // pages of Chain[:Hit] hold no block
	ToHost(req *Request, blocks int) error // blocks Chain[:blocks] into the host pages
	FromHost(req *Request) error           // blocks Chain[Hit:SaveEnd] to the backend's memory
}

// DirectIO is implemented by backends whose reads bypass the page cache, so
// the device must have served at least the restored bytes.
type DirectIO interface{ DirectIO() bool }
