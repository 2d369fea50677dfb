// Package kernels is tutti's GPU restore path: the GPU drives an io_uring
// itself (it writes the SQEs of a layer's reads, publishes the SQ tail, polls
// the CQ), a scatter kernel moves each layer from pinned staging into the
// engine's paged KV tensors in HBM, and every layer's readiness is a CUDA
// event that a compute stream can wait on with no host round trip.
//
// The CUDA side is libtutti_kernels.so (tk_bind.cu, tk_restore.cu,
// tk_hostcopy.cu, tk_ring_kernel.cu, tk_copy_kernel.cu, tk_mem.cu, each
// file's job listed in tk_ctx.cuh; the ABI header tutti_kernels.h, the
// layout rule tk_layout.h) and the test kit's
// libtutti_testkit.so (tk_testkit.cu, tk_cufile.cu, tk_prefill.cu;
// tk_testkit.h, tk_prefill.h), built by nvcc on
// a GPU machine with `make kernels` (sm_90 SASS + compute_90 PTX, static CUDA
// runtime: it needs the driver's libcuda, and the toolkit's libcublas for the
// prefill compute). This package loads it at run time with dlopen, so `go
// build` and CI need no CUDA. Without the library every call returns an error
// wrapping ErrNotLoaded; without a GPU, ErrNoGPU; the CPU path (package uring,
// runtime's PathCPU) works on. GPU tests skip with the reason, unless
// TUTTI_KERNELS_LIB names the library: then they must run and pass.
//
// # API for the runtime
//
//	Init(device) / DeviceName                load the library, select the device
//	Bind(Config) (*Restorer, error)          KV tensors (device pointers, Geometry, Layout,
//	                                         NumPages), a uring.Ring dedicated to the GPU
//	                                         (SQPOLL or not), the pinned staging pool
//	                                         (registered with the ring: READ_FIXED), request slots,
//	                                         streams, events: everything, once
//	(*Restorer).Restore(Request) (*Restore, error)
//	                                         Request: Pages (engine page of request page i)
//	                                         and, per layer, the object extents from objmap
//	                                         (fd or registered index, offset, pages); checked
//	                                         on the CPU (BuildPlan), then its first
//	                                         EnqueueLayers layers enqueued; a feeder goroutine
//	                                         enqueues the rest as earlier layers finish
//	(*Restore).StreamWaitLayer(l, stream)    the engine's compute stream waits for layer l
//	(*Restore).WaitLayer(l) / Wait()         host waits; per-entry results, failed pages
//	(*Restore).Release()                     frees the request slot (always call it)
//	(*Restorer).GatherLane(lane, pages, l0, n, dst, stride, crcs, afterEvent)
//	                                         save path: HBM -> registered host memory in
//	                                         object layout (within HBM into the lane's device
//	                                         staging, then the copy engine), after the engine's
//	                                         event, and each page plane's CRC32C computed on the
//	                                         GPU; the CPU then writes it (uring). GatherLanes()
//	                                         lanes, each its own stream, staging and page map:
//	                                         concurrent savers, no shared lock
//	(*Restorer).Gather(pages, l0, n, dst, stride)
//	                                         the same through the host map and copy stream
//	                                         (one at a time, waits for every host copy)
//	(*Restorer).SetHostMap/ScatterHost/ScatterDevice/RecordCopy/WaitCopy/SyncCopies
//	                                         copies for CPU-issued I/O (fallback, baselines)
//	HostRegister/HostUnregister              pin + map off-heap memory (uring.Buffer) for copies
//	(*Restorer).Close()
//
//	Test content, verification in HBM, the cuFile baseline and the harness's
//	prefill GEMMs are not here: they build into libtutti_testkit.so
//	(tk_testkit.h), loaded by package kernels/testkit, which only tests and
//	benchmarks import.
//
// # Ring protocol
//
// The ring is uring's (Ring.Layout gives the SQ/CQ indices, arrays and the
// memory regions); Bind cudaHostRegisters those regions, so GPU threads
// address them directly. The GPU is the ring's only producer while bound.
// Per layer, one I/O kernel (one block) runs on the context's I/O stream:
// thread 0 reads the SQ head (ld.acquire.sys) and computes the free slots —
// it never overruns them (back-pressure) nor the window (IOWindow, capped by
// the CQ size so the CQ cannot overflow); threads write the SQEs with plain
// stores, __threadfence_system, and thread 0 publishes the tail with
// st.release.sys. It reaps CQEs with ld.acquire.sys of the CQ tail (one CQE
// per thread, so a batch is reaped in one PCIe round trip), records
// each entry's status (ok, I/O error with errno, short, timeout) in a host-
// mapped result array, and releases the CQ head. Indices wrap modulo 2^32
// and are masked, so ring wrap-around needs nothing special. The kernel of
// layer l may submit entries of layers up to l+Lookahead of the same request,
// so the queue stays full across layer boundaries; it returns when every
// entry of layer l completed. Kernels of one context run in stream order, so
// one kernel at a time touches the ring, and several requests (MaxRequests)
// and layers are in flight.
//
// Polls are bounded: with no completion for PollTimeout the in-flight entries
// are marked timed out and the ring is marked broken (their data may still
// land later); later restores fail fast with ErrRingBroken. Close and re-bind
// a new ring after that.
//
// With SQPOLL, a CPU helper goroutine looks at the SQ flags every
// WakeInterval while a restore is live and enters the kernel only when the
// SQPOLL thread sleeps (IORING_SQ_NEED_WAKEUP); the SQPOLL thread polls a core
// while awake. A ring without SQPOLL runs in kick mode: a C loop on a locked
// thread (one cgo call for its life) submits exactly what the GPU published
// and sleeps in io_uring_enter until a batch of completions (a quarter of the
// I/O in flight, at most WakeBatch, ramping up from 1 at a restore's start:
// WakeRamp) or a timeout (BatchWait while I/O is in flight, WakeInterval,
// backed off, while none is); while no restore is live
// it sleeps on a futex. The SQEs the GPU publishes after the loop entered
// wait for its next return, so the devices hold up to two batches less than
// the window; with reads issued in plan order, the plan must spread every
// window over the devices (kernels/winsim models the window, the order and
// the batches against paced devices). NewKickRing makes the ring this loop wants: created
// disabled with DEFER_TASKRUN, handed to the loop's thread, which registers
// the staging pool and enables it, so completions run as its deferred task
// work and the kernel wakes it once per batch instead of once per I/O. The
// runtime uses kick mode unless runtime.GPUConfig.SQPoll.
//
// The staging slots are registered with the ring as fixed buffers (index =
// slot) and the GPU writes READ_FIXED SQEs, so the kernel does not pin the
// pages of every read; a refused registration falls back to plain reads and
// is reported (Restorer.FixedBuffers, runtime Stats.GPU.ReadMode). The I/O
// and scatter streams run at the device's highest priority, so the one-block
// I/O kernel is not starved by the engine's GEMMs.
//
// # Scatter, pipeline, failures
//
// Layer l's reads land in staging slot (global layer sequence) % StagingSlots
// in object layout; after the layer's I/O kernel, an event lets the copy
// engine move it into one of two device staging slots (its own stream; the
// host slot is free again once copied), and the scatter stream copy it from
// there into the KV tensors (one block per page, 16-byte vectors, per-layer
// layout [planes, num_pages, page_tokens, kv_heads, head_dim] or cross-layer
// [num_pages, layers, planes, ...]) and record the layer's ready event. All
// ordering is stream-ordered events, no host round trip, so layer l+1 is read
// while layer l is copied, scattered and consumed. (BenchOptions.ZeroCopyScatter: the
// scatter reads the host slot itself, holding SMs while PCIe delivers it.)
//
// Enqueueing a layer blocks once the GPU's command queue is full (about 60
// layers), so Restore enqueues only EnqueueLayers layers and a feeder
// goroutine enqueues the rest, EnqueueChunk layers per wake-up, layer l once
// layer l-EnqueueLayers+EnqueueChunk-1 is scattered (feed.go). Restores are
// fed in submission order (the staging slots are handed out in enqueue
// order); a host wait on a layer not yet enqueued waits
// for the feeder first, since an unrecorded event would not wait at all. A page is scattered only if every entry covering it is OK: a
// failed entry's pages keep what the KV memory held (Result.FailedPages
// counts them) — the engine recomputes them. Descriptors are checked twice
// before launch (BuildPlan in Go, again in C): engine pages in range and
// unique, staging offsets inside the slot, entries covering each page, file
// offsets aligned to the file's O_DIRECT alignment, so no kernel can write
// outside the registered tensors or the staging pool.
//
// # Memory
//
// Bind allocates everything: the two device staging slots, the staging pool (uring.AllocBuffer: 2 MiB
// aligned, transparent huge pages where the kernel gives them, so a 1 MiB
// read is one segment the block layer need not split and io_uring issues it
// inline instead of in an io-wq worker; registered with CUDA), per request slot the pinned descriptor upload buffers, device
// descriptor tables, host-mapped result arrays and per-layer events. Restore
// allocates nothing on the GPU or in pinned memory; the library copies the
// descriptors during the call, so the caller's slices are free afterwards.
// A Restore's Result is valid until its Release.
package kernels
