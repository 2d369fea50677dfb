package harness

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

// PerBlock stores every chain block in a fixed slot of one preallocated file
// and moves it with one O_DIRECT io_uring I/O per paged block and layer (K
// and V of the page together, as a vectored read straight into the engine's
// pages), the way per-page offloading connectors work. It is the "no object
// batching" baseline: the same engine and queue depth as tutti's CPU path,
// but ChunkPages × Layers I/Os per chain block.
//
// With several directories (Env.Dirs) there is one slot file in each, and
// slot s is slot s/N of the file in dir s mod N: consecutive slots, as the
// allocator hands them out, land on different devices.
//
// Within a slot, (layer l, page i) lives at (l*ChunkPages + i) * stride,
// stride = PageBytesPerLayer rounded up to 4 KiB. When a page of one plane is
// not a multiple of 4 KiB (MLA: 18 KiB per page), the I/O goes through a
// per-operation bounce buffer of stride bytes instead (counted in Stats).
type PerBlock struct {
	// NewEngine, if set, makes the I/O engine instead of an io_uring ring
	// (tests pass a *uringsim.Sim with fault injectors).
	NewEngine func(queueDepth int) (uring.Engine, error)

	env     Env
	ring    uring.Engine
	files   []*uring.File // one per Env.Dirs
	stride  int64
	slotB   int64
	direct  bool
	slots   map[uint64]int64
	free    []int64
	ops     []pbOp
	freeOps []int
	bounce  *uring.Buffer

	// per call
	start      time.Time
	layerLeft  []int
	layerReady []time.Duration
	failedAt   int // lowest block index with an error, or -1
	firstErr   error
	bounceCopy int64
}

type pbOp struct {
	c     uring.Completion
	iov   *uring.Iovecs
	write bool
	layer int
	block int
	pages []int32 // the block's pages
	page  int     // index within the chunk
}

// NewPerBlock returns the per-block backend.
func NewPerBlock() *PerBlock { return &PerBlock{} }

func (p *PerBlock) Name() string { return "per-block" }
func (p *PerBlock) Label() string {
	return "one O_DIRECT io_uring I/O per page and layer: the no-batching bound, not any product's design (an older stand-in; vllm-fs is vLLM's file tier)"
}
func (p *PerBlock) DirectIO() bool { return true }

func (p *PerBlock) Available() error {
	if p.NewEngine != nil {
		return nil
	}
	r, err := uring.New(uring.Config{Entries: 8, SQThreadCPU: -1})
	if err != nil {
		return fmt.Errorf("per-block: io_uring: %v: %w", err, ErrUnavailable)
	}
	return r.Close()
}

func (p *PerBlock) Open(env Env) error {
	g := env.Geometry
	p.env = env
	p.stride = (g.PageBytesPerLayer() + 4095) &^ 4095
	p.slotB = int64(g.Layers) * int64(g.ChunkPages) * p.stride
	p.direct = g.PageBytesPerPlane()%4096 == 0
	qd := env.QueueDepth
	if qd <= 0 {
		qd = 64
	}
	var err error
	if p.NewEngine != nil {
		p.ring, err = p.NewEngine(qd)
	} else {
		p.ring, err = uring.New(uring.Config{Entries: uint32(qd), MaxInFlight: qd, SQThreadCPU: -1})
	}
	if err != nil {
		return fmt.Errorf("per-block: %w", err)
	}
	dirs := env.Dirs
	if len(dirs) == 0 {
		dirs = []string{env.Dir}
	}
	for i, d := range dirs {
		path := filepath.Join(d, "slots.dat")
		f, err := uring.OpenFile(path, unix.O_RDWR|unix.O_CREAT|unix.O_DIRECT, 0o600)
		if err != nil {
			return fmt.Errorf("per-block: %w", err)
		}
		p.files = append(p.files, f)
		// the slots s with s mod N = i: the total over the files is the capacity
		n := (int64(env.CapacityBlocks) + int64(len(dirs)-1-i)) / int64(len(dirs))
		if err := unix.Ftruncate(int(f.FD), n*p.slotB); err != nil {
			return fmt.Errorf("per-block: sizing %s: %w", path, err)
		}
	}
	p.slots = map[uint64]int64{}
	for s := int64(env.CapacityBlocks) - 1; s >= 0; s-- {
		p.free = append(p.free, s)
	}
	if !p.direct {
		if p.bounce, err = uring.AllocBuffer(qd * int(p.stride)); err != nil {
			return fmt.Errorf("per-block: bounce: %w", err)
		}
	}
	p.ops = make([]pbOp, qd)
	for i := range p.ops {
		op := &p.ops[i]
		if op.iov, err = uring.NewIovecs(2); err != nil {
			return fmt.Errorf("per-block: %w", err)
		}
		op.c.UserData = uint64(i)
		op.c.Callback = p.done
		p.freeOps = append(p.freeOps, i)
	}
	return nil
}

func (p *PerBlock) bounceAt(i int) (uintptr, []byte) {
	off := int64(i) * p.stride
	return p.bounce.Addr() + uintptr(off), p.bounce.Bytes()[off : off+p.stride]
}

// done runs in Flush for each completed I/O.
func (p *PerBlock) done(c *uring.Completion) {
	i := int(c.UserData)
	op := &p.ops[i]
	g := p.env.Geometry
	want := g.PageBytesPerLayer()
	if !p.direct {
		want = p.stride
	}
	if c.Err == nil && c.Result != want {
		c.Err = fmt.Errorf("short transfer: %d of %d bytes", c.Result, want)
	}
	if c.Err != nil {
		if p.failedAt < 0 || op.block < p.failedAt {
			p.failedAt = op.block
		}
		if p.firstErr == nil {
			p.firstErr = c.Err
		}
	} else if !op.write && !p.direct {
		_, b := p.bounceAt(i)
		n := g.PageBytesPerPlane()
		for pl := 0; pl < g.Planes; pl++ {
			copy(p.env.KV.Page(op.layer, pl, op.pages[op.page]), b[int64(pl)*n:int64(pl+1)*n])
		}
		p.bounceCopy += want
	}
	if !op.write {
		p.layerLeft[op.layer]--
		if p.layerLeft[op.layer] == 0 {
			p.layerReady[op.layer] = time.Since(p.start)
		}
	}
	p.freeOps = append(p.freeOps, i)
}

// submit prepares and submits one page I/O, flushing while no op is free.
func (p *PerBlock) submit(write bool, layer, block int, pages []int32, page int, slot int64) error {
	for len(p.freeOps) == 0 {
		if err := p.ring.Flush(1); err != nil {
			return fmt.Errorf("per-block: flush: %w", err)
		}
	}
	i := p.freeOps[len(p.freeOps)-1]
	p.freeOps = p.freeOps[:len(p.freeOps)-1]
	op := &p.ops[i]
	op.write, op.layer, op.block, op.pages, op.page = write, layer, block, pages, page
	g := p.env.Geometry
	file := p.files[slot%int64(len(p.files))]
	off := uint64(slot/int64(len(p.files))*p.slotB + (int64(layer)*int64(g.ChunkPages)+int64(page))*p.stride)
	if p.direct {
		op.iov.Reset()
		for pl := 0; pl < g.Planes; pl++ {
			if err := op.iov.Append(p.env.KV.PageAddr(layer, pl, pages[page]), int(g.PageBytesPerPlane())); err != nil {
				return err
			}
		}
		if write {
			op.c.PrepWritev(file, op.iov, off)
		} else {
			op.c.PrepReadv(file, op.iov, off)
		}
	} else {
		addr, b := p.bounceAt(i)
		if write {
			n := g.PageBytesPerPlane()
			for pl := 0; pl < g.Planes; pl++ {
				copy(b[int64(pl)*n:int64(pl+1)*n], p.env.KV.Page(layer, pl, pages[page]))
			}
			op.c.PrepWrite(file, addr, uint32(p.stride), off)
		} else {
			op.c.PrepRead(file, addr, uint32(p.stride), off)
		}
	}
	if err := p.ring.Submit(&op.c); err != nil {
		p.freeOps = append(p.freeOps, i)
		return fmt.Errorf("per-block: submitting layer %d block %d page %d: %w", layer, block, page, err)
	}
	return nil
}

func (p *PerBlock) drain() error {
	for p.ring.InFlight() > 0 {
		if err := p.ring.Flush(1); err != nil {
			return fmt.Errorf("per-block: flush: %w", err)
		}
	}
	return nil
}

func (p *PerBlock) reset(layers int) {
	p.start = time.Now()
	p.layerLeft = make([]int, layers)
	p.layerReady = make([]time.Duration, layers)
	p.failedAt, p.firstErr = -1, nil
}

func (p *PerBlock) Restore(req *Request) (RestoreResult, error) {
	g := p.env.Geometry
	p.reset(g.Layers)
	for l := range p.layerLeft {
		p.layerLeft[l] = req.Hit * g.ChunkPages
	}
	res := RestoreResult{}
	var subErr error
loop:
	for l := 0; l < g.Layers; l++ {
		for b := 0; b < req.Hit; b++ {
			slot, ok := p.slots[req.Chain[b]]
			if !ok {
				subErr = fmt.Errorf("per-block: block %d (%d) not stored", b, req.Chain[b])
				break loop
			}
			pages := req.BlockPages(g.ChunkPages, b)
			for i := 0; i < g.ChunkPages; i++ {
				if subErr = p.submit(false, l, b, pages, i, slot); subErr != nil {
					break loop
				}
				res.IOs++
			}
		}
	}
	if err := p.drain(); err != nil {
		return res, err
	}
	if subErr != nil {
		return res, subErr
	}
	res.LayerReady = p.layerReady
	res.Blocks = req.Hit
	if p.failedAt >= 0 {
		res.Blocks = p.failedAt
		res.Fallbacks = req.Hit - p.failedAt
	}
	res.Runs = req.Hit // every block is its own slot
	res.Bytes = int64(res.Blocks) * g.ChunkBytes()
	perIO := g.PageBytesPerLayer()
	if !p.direct {
		perIO = p.stride
	}
	res.ReadBytes = res.IOs * perIO
	// Slot s lies in file s % len(files) (Open), one file per directory.
	res.ReadBytesPerDir = make([]int64, len(p.files))
	for b := 0; b < res.Blocks; b++ {
		res.ReadBytesPerDir[p.slots[req.Chain[b]]%int64(len(p.files))] += int64(g.Layers*g.ChunkPages) * perIO
	}
	return res, nil
}

func (p *PerBlock) Save(req *Request) (SaveResult, error) {
	g := p.env.Geometry
	p.reset(g.Layers)
	var res SaveResult
	for b := req.Hit; b < req.SaveEnd; b++ {
		id := req.Chain[b]
		slot, ok := p.slots[id]
		if !ok {
			if len(p.free) == 0 {
				res.Fallbacks += req.SaveEnd - b
				break
			}
			slot = p.free[len(p.free)-1]
			p.free = p.free[:len(p.free)-1]
			p.slots[id] = slot
		}
		pages := req.BlockPages(g.ChunkPages, b)
		for l := 0; l < g.Layers; l++ {
			for i := 0; i < g.ChunkPages; i++ {
				if err := p.submit(true, l, b, pages, i, slot); err != nil {
					p.drain()
					return res, err
				}
				res.IOs++
			}
		}
		res.Blocks++
	}
	if err := p.drain(); err != nil {
		return res, err
	}
	if p.firstErr != nil {
		// A failed write leaves that block unusable: drop it and everything after.
		for b := max(p.failedAt, req.Hit); b < req.SaveEnd; b++ {
			if s, ok := p.slots[req.Chain[b]]; ok {
				delete(p.slots, req.Chain[b])
				p.free = append(p.free, s)
			}
		}
		dropped := req.Hit + res.Blocks - max(p.failedAt, req.Hit)
		res.Blocks -= dropped
		res.Fallbacks += dropped
		if !errors.Is(p.firstErr, unix.ENOSPC) {
			return res, fmt.Errorf("per-block: save: %w", p.firstErr)
		}
	}
	res.Bytes = int64(res.Blocks) * g.ChunkBytes()
	return res, nil
}

func (p *PerBlock) Evict(ids []uint64) error {
	for _, id := range ids {
		if s, ok := p.slots[id]; ok {
			delete(p.slots, id)
			p.free = append(p.free, s)
		}
	}
	return nil
}

// BounceBytes is how many bytes went through the bounce buffer (MLA shapes).
func (p *PerBlock) BounceBytes() int64 { return p.bounceCopy }

func (p *PerBlock) Close() error {
	var errs []error
	if p.ring != nil {
		errs = append(errs, p.drain(), p.ring.Close())
	}
	for _, f := range p.files {
		errs = append(errs, f.Close())
	}
	for i := range p.ops {
		if p.ops[i].iov != nil {
			errs = append(errs, p.ops[i].iov.Free())
		}
	}
	if p.bounce != nil {
		errs = append(errs, p.bounce.Free())
	}
	p.ring, p.files, p.ops, p.bounce = nil, nil, nil, nil
	return errors.Join(errs...)
}
