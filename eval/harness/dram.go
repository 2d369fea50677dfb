package harness

import (
	"fmt"
	"sync"
	"time"

	"github.com/tutti-io/tutti/uring"
)

// DRAM keeps chain blocks in host memory: the upper bound of any storage tier
// (no device: memcpy per page, layer by layer, a layer's blocks in parallel). Its capacity is
// the shared block capacity, so Available refuses when that would not fit in
// half of the machine's available memory.
type DRAM struct {
	env   Env
	arena *uring.Buffer // CapacityBlocks slots of ChunkBytes, off-heap (no GC, no zeroing per save)
	slots map[uint64]int64
	free  []int64
}

// dramCopyThreads bounds the goroutines copying one layer of a restore (the
// vllm-fs design's 16 reader threads copy in parallel too).
const dramCopyThreads = 8

// NewDRAM returns the dram backend.
func NewDRAM() *DRAM { return &DRAM{} }

func (d *DRAM) Name() string { return "dram" }

func (d *DRAM) Available() error { return nil }

// checkMemory refuses capacities beyond half of MemAvailable.
func checkMemory(capacityBytes int64) error {
	if avail := memAvailable(); capacityBytes > avail/2 {
		return fmt.Errorf("dram: capacity %d MiB exceeds half of available memory (%d MiB): %w",
			capacityBytes>>20, avail>>20, ErrUnavailable)
	}
	return nil
}

func (d *DRAM) Open(env Env) error {
	if err := checkMemory(env.CapacityBytes); err != nil {
		return err
	}
	arena, err := uring.AllocBuffer(int(env.CapacityBytes))
	if err != nil {
		return fmt.Errorf("dram: %w", err)
	}
	d.env, d.arena, d.slots, d.free = env, arena, map[uint64]int64{}, nil
	for s := int64(env.CapacityBlocks) - 1; s >= 0; s-- {
		d.free = append(d.free, s)
	}
	return nil
}

func (d *DRAM) slot(s int64) []byte {
	n := d.env.Geometry.ChunkBytes()
	return d.arena.Bytes()[s*n : (s+1)*n]
}

func (d *DRAM) Restore(req *Request) (RestoreResult, error) {
	g := d.env.Geometry
	res := RestoreResult{LayerReady: make([]time.Duration, g.Layers)}
	slots := make([]int64, req.Hit)
	for b := 0; b < req.Hit; b++ {
		s, ok := d.slots[req.Chain[b]]
		if !ok {
			return res, fmt.Errorf("dram: restoring block %d (%d): not stored", b, req.Chain[b])
		}
		slots[b] = s
	}
	start := time.Now()
	threads := min(req.Hit, dramCopyThreads)
	for l := 0; l < g.Layers; l++ {
		// A layer's blocks are copied by up to dramCopyThreads goroutines at
		// once: one core's memcpy put the DRAM tier below the storage tiers
		// it bounds.
		var wg sync.WaitGroup
		for w := 0; w < threads; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for b := w; b < req.Hit; b += threads {
					scatterLayer(&d.env, d.slot(slots[b]), l, req.BlockPages(g.ChunkPages, b))
				}
			}()
		}
		wg.Wait()
		res.IOs += int64(req.Hit)
		res.LayerReady[l] = time.Since(start)
	}
	res.Blocks, res.Runs = req.Hit, req.Hit
	res.Bytes = int64(req.Hit) * g.ChunkBytes()
	res.ReadBytes = res.Bytes
	return res, nil
}

func (d *DRAM) Save(req *Request) (SaveResult, error) {
	g := d.env.Geometry
	var res SaveResult
	for b := req.Hit; b < req.SaveEnd; b++ {
		s, ok := d.slots[req.Chain[b]]
		if !ok {
			if len(d.free) == 0 {
				res.Fallbacks += req.SaveEnd - b
				break
			}
			s = d.free[len(d.free)-1]
			d.free = d.free[:len(d.free)-1]
			d.slots[req.Chain[b]] = s
		}
		gatherBlock(&d.env, d.slot(s), req.BlockPages(g.ChunkPages, b))
		res.Blocks++
		res.Bytes += g.ChunkBytes()
		res.IOs++
	}
	return res, nil
}

func (d *DRAM) Evict(ids []uint64) error {
	for _, id := range ids {
		if s, ok := d.slots[id]; ok {
			delete(d.slots, id)
			d.free = append(d.free, s)
		}
	}
	return nil
}

func (d *DRAM) Close() error {
	d.slots, d.free = nil, nil
	if d.arena == nil {
		return nil
	}
	err := d.arena.Free()
	d.arena = nil
	return err
}

// Recompute keeps nothing: every request prefills from scratch. It is the
// baseline any cache must beat.
type Recompute struct{}

func (Recompute) Name() string                            { return "recompute" }
func (Recompute) Available() error                        { return nil }
func (Recompute) Open(Env) error                          { return nil }
func (Recompute) Lookup([]uint64) int                     { return 0 }
func (Recompute) Restore(*Request) (RestoreResult, error) { return RestoreResult{}, nil }
func (Recompute) Save(*Request) (SaveResult, error)       { return SaveResult{}, nil }
func (Recompute) Evict([]uint64) error                    { return nil }
func (Recompute) Close() error                            { return nil }
