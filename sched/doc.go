// Package sched is tutti's slack-aware I/O scheduler: it decides how much of a
// cached prefix to load and how much to recompute, orders reads by least
// slack, defers save writes into slack while bounding their delay, and keeps
// compute and device models calibrated online. It is a pure, deterministic
// library: no goroutines, no clock (every call takes the time as int64
// nanoseconds), no I/O. The runtime performs the I/O; sched/sim replays traces
// through the same calls.
//
// # Models
//
// ComputeModel: one layer's prefill of n tokens from position s costs
// scale·(FixedNs + PerTokenNs·n + PerPairNs·(n·s + n(n+1)/2)), seeded by
// FitCompute (least squares over measured layer times, non-negative) or
// ComputeFromFLOPs (weights and attention FLOPs over measured GEMM/attention
// rates); scale is corrected by ObserveLayer: an exponential average in the
// log domain, weight 1/8, each step clipped to ±ln 2, scale kept in [1/16, 16].
//
// DeviceModel: an op costs max(bytes/bandwidth, 1/IOPS) of device busy time;
// reads next to writes get ReadShareUnderWrites of their bandwidth, writes
// next to reads WriteShareUnderReads (measured with sched/internal/rwbench on
// devbench's engine; see BENCHMARKS.md). ObserveReads/ObserveWrites correct
// bandwidth, IOPS and the shares with the same bounded log-domain average.
//
// # The split
//
// A request has P cached blocks (in runs) and U uncached tokens. A run's
// layers lie on one device (Run.Device) or spread over several
// (Run.LayerDevices, the caller's placement: objmap.Layout puts layer l of a
// run on device (home + l) mod W); each device reads its share in layer
// order. Loading blocks [0,k) and recomputing [k,P) plus the suffix, the
// layer pipeline ends at F(k) = max(cR + L·C, max_d(t0_d + first_d + (L −
// firstL_d)·C), max_d(t0_d + total_d + (L − lastL_d)·C)), where C = C(k) is
// one layer's compute of the tokens from k·B, first_d the read time of
// device d's first layer of [0,k) (layer firstL_d), total_d that of all its
// reads (the last of layer lastL_d), t0_d when device d can start (after
// what it has admitted, slowed by writes in flight) and cR when the GPU can
// start this request. For runs on one device each that is max(cR + L·C,
// max_d(t0_d + D_d) + L·C, max_d(t0_d + L·D_d) + C), D_d the per-layer read
// time of device d's share; a run spread over W devices reads W layers at
// once and its last W complete together. The two reads per device bound
// every layer's where each device's share is spread evenly over the layers
// (the plan's deadlines follow the exact pipeline where it is not). The
// per-device sums only grow with k, so F(k) costs O(devices touched) per
// candidate and PlanLoad scans every k (O(runs·layers + blocks·devices))
// and takes the least F(k) + w·C(k): the first token plus
// w layers' compute of what the split leaves to the GPU, so a cached block
// is recomputed only where that makes the first token earlier by more than
// the compute it adds to w layers (a slightly earlier first token is not
// bought with a large recompute that delays every queued prefill); ties go
// to less loading. w = 1 when the caller gives the GPU's queue
// (ComputeReadyNs), w = L, the whole recompute, when it cannot
// (LoadRequest.QueueUnknown: the runtime's case).
// Reads are then queued as one cursor per (plan, device), each holding the
// device's reads in layer order with their planned completions: one planner
// record per (plan, device), not per read.
//
// # Deadlines and slack
//
// Layer l's reads are due at deadline_l = F − (L−l)·C, the latest start of
// layer l's compute that does not delay the first token; the planned
// completion of the layer's reads is at or before it. Dispatch hands out
// reads by earliest deadline (least slack). A queued save write is dispatched
// only if (a) the device has no pending reads, (b) every pending read keeps
// SlackMarginNs of slack after the delay the write causes it, each read's
// slack discounted by SlackFrac of its remaining horizon (predictions err in
// proportion to how far ahead they look), and the device is not running
// behind its plans, or (c) the save queue reached its promotion time: the
// latest moment the queue can start draining and still finish every write
// (in flight and queued) within SaveBoundNs of its EnqueueSave, with writes
// at the write share while the reads in flight drain (at the read share)
// and at the full rate after. From the moment the writes need it, Dispatch
// starts no read that would push them past their bound (counted in
// Stats.ReadHolds): a save is deferred into slack, not cut, as long as the
// device can write it in time. EnqueueSave admits only the leading blocks
// whose writes, after the write work ahead of them and beside the reads
// already admitted, fit that bound (ReasonSaveBound) and the pending save
// bytes (ReasonSaveBudget, none by default), so admitted saves never miss
// the bound when the models hold: on an idle device a save gets the full
// write rate, next to a long read backlog the write share.
//
// # How the runtime uses it
//
// One Planner per store, owned by the I/O goroutine (not safe for concurrent
// use). Times are the runtime's monotonic clock in ns.
//
//	p, err := sched.NewPlanner(sched.Config{Layers, BlockTokens, Compute, Devices, SaveBoundNs, ...})
//
//	// Load(chain, pages): after prefix lookup and objmap resolved the cached
//	// prefix into runs (one extent per run per layer):
//	plan, err := p.PlanLoad(sched.LoadRequest{ID, NowNs, ComputeReadyNs, Runs, UncachedTokens, SegmentsOnly})
//	//   plan.LoadBlocks: restore blocks [0, LoadBlocks); the engine recomputes the rest
//	//   (Load.Blocks() reports LoadBlocks; the rest is a miss to the engine);
//	//   plan.NotAdmitted says why the rest is not loaded (recompute-faster,
//	//   read-budget, queue-full). Per layer there is one read per
//	//   plan.Segments entry (len(plan.Reads) = Layers × len(Segments));
//	//   SegmentsOnly skips building the plan.Reads list.
//
//	// Save(chain, pages), after the pages were gathered:
//	tk, err := p.EnqueueSave(sched.SaveRequest{ID, NowNs, Device, Blocks, BytesPerLayerPerBlock})
//	//   save only the leading tk.Blocks blocks (count the rest as dropped).
//
//	// The I/O loop: after PlanLoad, EnqueueSave, each batch of completions,
//	// and when the clock reaches p.NextWakeNs():
//	ios = p.Dispatch(now, ios[:0])   // submit each: IORead = layer io.Layer of run io.Run,
//	                                 //   first io.Blocks blocks; IOWrite = io.Bytes at
//	                                 //   io.OffsetBytes of layer io.Layer's object of save io.ReqID
//	p.Complete(io.ID, now)           // for every op Dispatch handed out, ok or failed
//	p.ObserveReads(dev, bytes, ops, busyNs, withWrites)   // per completion batch
//	p.ObserveWrites(dev, bytes, ops, busyNs, withReads)
//	p.ObserveLayer(tokens, startPos, ns)                  // when the engine reports layer times
//	p.Cancel(loadID)                 // the engine dropped a request: forget its queued reads
//
//	// A restore the GPU drives itself (LoadRequest.Whole): Dispatch hands
//	// it out as one IORestore when every device it reads from can take all
//	// of it; its reads stay pending there (deadlines, slack, budgets, so
//	// saves wait behind them as behind IORead) until the GPU reports layers:
//	p.CompleteLayers(restore.ID, layersDone, now)   // layers [0, layersDone) are in HBM
//	p.Complete(restore.ID, now)                     // the restore ended: retire the rest
//
// Everything is bounded: reads and writes in flight per device (count and
// bytes), pending read and save bytes per device (admission), and the
// planner's record table (MaxPendingIOs). PlanLoad and EnqueueSave never
// block; what does not fit is reported, not queued.
package sched
