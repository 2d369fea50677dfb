package kernels

// BenchOptions are A/B switches kept only so that a benchmark can measure a
// default against the design it replaced, in the same run. The product never
// sets them: Bind is BindBench with none set. Each names the baseline it
// restores.
type BenchOptions struct {
	// LooseWakeTarget (kick mode) restores the helper's first wait target:
	// completions in flight less a batch, counting those the GPU reaps while
	// the helper computes it, so a layer's last completions could wait for
	// BatchWait. By default the wait counts only completions that arrive
	// after it starts (unless the GPU is seen not to reap), and a wait for a
	// single completion times out after 4 WakeIntervals, so a layer's
	// last completions are seen without waiting for a batch.
	LooseWakeTarget bool
	// ZeroCopyScatter: the scatter kernel reads each restored layer from
	// pinned host staging itself. By default the copy engine moves the layer
	// into one of two device staging slots (2 × the staging slot size of HBM,
	// allocated at Bind) and the scatter runs within HBM: a zero-copy scatter
	// holds many blocks of SMs, at the highest priority, for as long as PCIe
	// takes to deliver the layer, which slows the engine's own kernels next
	// to it.
	ZeroCopyScatter bool
	// ZeroCopyGather: a save's gather kernel writes the pages into pinned
	// host memory itself. By default it copies them within HBM into its
	// lane's device staging (TK_GATHER_STAGE_BYTES each, allocated at Bind)
	// and the copy engine moves them to the host: a zero-copy gather holds
	// blocks of SMs for as long as PCIe takes, beside the engine's kernels.
	ZeroCopyGather bool
	// NoFixedBuffers keeps the staging pool unregistered with the ring: every
	// SQE is a plain READ/WRITE and the kernel pins the pages of each I/O
	// itself. By default the pool is registered slot by slot (buffer index =
	// slot) and the GPU writes READ_FIXED/WRITE_FIXED, which takes the page
	// pinning (the bulk of the CPU time of a large O_DIRECT read) off the
	// per-I/O path. A refused registration is reported by FixedBuffers.
	NoFixedBuffers bool
}

// BenchOptions returns the switches r was bound with.
func (r *Restorer) BenchOptions() BenchOptions { return r.opts }
