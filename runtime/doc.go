// Package runtime is the Go API an LLM serving engine links to keep its KV
// cache on local SSDs and restore it faster than recomputing it.
//
// # API
//
//	Open(Config) (*Store, error)          validate, lock the dirs, recover, start the I/O goroutines
//	OpenWithFallback(Config)              PathGPU, else PathCPU — counted in Stats.Path.Fallbacks
//	(*Store).RegisterKV(KVMemory)         the engine's paged KV memory, once (host: PathCPU; HBM: PathGPU)
//	AllocHostKV(g, layout, pages)         off-heap host KV memory for tests and tools
//	(*Store).Lookup(chain) int            cached leading chain blocks; no I/O
//	(*Store).Load(chain, pages) (*Load, error)
//	    (*Load).WaitLayer(l) / StreamWaitLayer(l, stream) / Wait() / Blocks() / Planned() / Cached() / Failure()
//	(*Store).Save(chain, pages) (*Save, error)
//	    (*Save).Gathered() / Done() / Wait() / Saved() / Skipped(cause)
//	(*Store).WaitSaves() / Stats() / Check() / Recovery() / Close()
//	CapacityForBlocks(g, n)               a CapacityBytes that holds n blocks in any run grouping
//	CapacityForBlocksOn(g, n, dirs)       the same for a new store over dirs directories
//	DeviceSizedGPUReads(dirs) GPUReads    the GPU path's reads sized to the dirs' disks (the zero GPUConfig)
//
// A chain is a request's prefix as chained block ids (id i names the whole
// prefix up to block i); pages is its block table: pages[i*ChunkPages+j] is
// the engine's page id of page j of chain block i.
//
// # Contracts
//
//   - Load returns before any I/O. Layer l of the loaded blocks is in the KV
//     memory when WaitLayer(l) returns; layers complete in order. Blocks() is
//     the number of leading chain blocks restored: it only decreases while
//     the load runs (a failed or corrupt run is a miss for it and every run
//     after it, counted by MissCause) and is final after Wait. Pages past
//     Blocks() hold unspecified bytes: recompute them. Nothing that failed its
//     CRC32C is ever reported restored (PathCPU reads exactly the chunks it
//     needs and verifies each against the run's chunk table; PathGPU reports
//     the kernels' per-entry I/O status and does not check CRCs).
//   - Save returns at once; the scheduler defers its writes into the slack of
//     loads within Config.SaveBoundMs, on PathGPU too: a GPU restore is one
//     job of the scheduler (sched.LoadRequest.Whole) whose reads hold their
//     devices from dispatch until the GPU reports each layer done. The pages
//     must stay unchanged until Gathered is closed. A run is served only after its payload, header and
//     journal record are durable; what the index, the pool or the save budget
//     cannot take, and any write error, skips blocks (counted by SkipCause),
//     never blocks.
//   - KV memory given to RegisterKV belongs to the engine and must stay valid
//     until Close; chain and pages must stay unchanged until the Load's Wait
//     returned or the Save's Done is closed.
//   - Every method is safe for concurrent use. Everything is bounded:
//     staging (StagingBytes, allocated at Open), I/Os in flight (QueueDepth),
//     loads in flight (MaxLoads: ErrBusy beyond), pending saves (what
//     the devices write within SaveBoundMs, and SaveBudgetBytes).
//
// # Goroutines
//
// One goroutine owns the io_uring engine (single issuer) and runs
// completions; one runs the scheduler's dispatch loop; each Load and Save has
// one that drives its I/O, ending with it. min(GOMAXPROCS, 8) stage
// goroutines shared by the saves gather and checksum their writes. On
// PathCPU, as many consume goroutines shared by the loads verify and
// scatter every completed staging slot (the CRC32C and copy are a restore's
// CPU work; a read split over several slots is checked in pieces), so a
// load's restore is not bound by one core.
//
// # Inside
//
// This package is the API and the orchestration: what a Load, a Save, a
// Hold and Open do, in which order, and what they count. The mechanisms
// are packages under runtime/internal, one job each: catalog (the served
// runs beside the prefix index, and its rebuild at Open), admission (a
// save's reservations as one transaction), mover (the seam to whoever moves
// the bytes) with mover/cpu and mover/gpu, savewrite (the save write
// pipeline), staging, ring (the io_uring goroutine), iosched (the
// scheduler wiring), workpool, devprobe, prewrite, kvmeta (the
// event-publishing index and its sidecar) and lrufile. docs/architecture.md
// draws them.
//
// See docs/integration.md for what each call costs and how an engine drives it.
package runtime
