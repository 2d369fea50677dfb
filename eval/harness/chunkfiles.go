package harness

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

// chunkFiles is the store the file-per-chunk baselines share (lmcache-disk,
// lmcache-gds, vllm-fs): each chain block is cut into chunks of
// chunkPages engine pages, and each chunk is one file holding every layer
// of its pages (chunkcopy.go's format) after headerBytes of header. A pool
// of `threads` I/O goroutines, each doing blocking preads/pwrites (so each
// is one kernel thread while it waits) into its own host staging buffer,
// serves a request's chunks; the worker copies a chunk from staging into
// the KV pages once it is read (host staging, then copy). Files are spread
// over Env.Dirs by chunk id. Every layer of a restore is ready when the last
// chunk is: a chunk file holds all layers.
type chunkFiles struct {
	name        string
	chunkPages  int  // engine pages per chunk file
	headerBytes int  // before the payload; verified on read when > 0
	direct      bool // O_DIRECT (payload and header rounded up to 4 KiB)
	threads     int

	env       Env
	fileBytes int64 // header + payload, rounded up to 4 KiB when direct
	perBlock  int   // chunks per chain block
	jobs      chan chunkJob
	wg        sync.WaitGroup
	// readFile, when set, replaces the staging read (the GDS backend's
	// cuFile variant): worker i reads the whole file into the n bytes at dst
	// (its staging buffer).
	readFile func(worker int, path string, dst uintptr, n int64) error
}

type chunkJob struct {
	write bool
	id    uint64 // chain block id
	sub   int    // chunk within the block
	pages []int32
	done  chan<- chunkDone
	block int
}

type chunkDone struct {
	block int
	err   error
}

// chunkMagic starts the header of a chunk file that has one.
const chunkMagic = 0x7475747469636b31 // "tuttick1"

func (c *chunkFiles) open(env Env) error {
	g := env.Geometry
	if c.chunkPages <= 0 || g.ChunkPages%c.chunkPages != 0 {
		return fmt.Errorf("%s: a chunk of %d pages does not divide a chain block of %d pages", c.name, c.chunkPages, g.ChunkPages)
	}
	if c.threads < 1 || c.threads > 256 {
		return fmt.Errorf("%s: %d I/O threads, want 1..256", c.name, c.threads)
	}
	c.env = env
	c.perBlock = g.ChunkPages / c.chunkPages
	c.fileBytes = int64(c.headerBytes) + int64(c.chunkPages)*int64(g.Layers)*g.PageBytesPerLayer()
	if c.direct {
		c.fileBytes = (c.fileBytes + 4095) &^ 4095
	}
	if c.fileBytes > 1<<31 {
		return fmt.Errorf("%s: a chunk file of %d bytes is above one read's 2 GiB", c.name, c.fileBytes)
	}
	c.jobs = make(chan chunkJob, c.threads*4)
	for i := 0; i < c.threads; i++ {
		buf, err := uring.AllocBuffer(int(c.fileBytes))
		if err != nil {
			c.close()
			return fmt.Errorf("%s: staging buffer: %w", c.name, err)
		}
		c.wg.Add(1)
		go c.worker(i, buf)
	}
	return nil
}

func (c *chunkFiles) close() error {
	if c.jobs != nil {
		close(c.jobs)
		c.wg.Wait()
		c.jobs = nil
	}
	return nil
}

func (c *chunkFiles) path(id uint64, sub int) string {
	dir := c.env.Dir
	if len(c.env.Dirs) > 0 {
		dir = c.env.Dirs[c.dirOf(id, sub)]
	}
	return filepath.Join(dir, fmt.Sprintf("%x-%d.kv", id, sub))
}

// dirOf is the Env.Dirs entry chunk sub of block id lies in.
func (c *chunkFiles) dirOf(id uint64, sub int) int {
	return spreadIndex(id*uint64(c.perBlock+1)+uint64(sub), len(c.env.Dirs))
}

func (c *chunkFiles) flags() int {
	if c.direct {
		return unix.O_DIRECT
	}
	return 0
}

func (c *chunkFiles) worker(i int, buf *uring.Buffer) {
	defer c.wg.Done()
	defer buf.Free()
	for j := range c.jobs {
		var err error
		if j.write {
			err = c.writeChunk(buf, j)
		} else {
			err = c.readChunk(i, buf, j)
		}
		j.done <- chunkDone{block: j.block, err: err}
	}
}

func (c *chunkFiles) header(id uint64, sub int, dst []byte) {
	binary.LittleEndian.PutUint64(dst[0:], chunkMagic)
	binary.LittleEndian.PutUint64(dst[8:], id)
	binary.LittleEndian.PutUint64(dst[16:], uint64(sub))
	binary.LittleEndian.PutUint64(dst[24:], uint64(c.fileBytes-int64(c.headerBytes)))
}

func (c *chunkFiles) readChunk(worker int, buf *uring.Buffer, j chunkJob) error {
	p := c.path(j.id, j.sub)
	b := buf.Bytes()
	var got int
	var err error
	if c.readFile != nil {
		err = c.readFile(worker, p, buf.Addr(), c.fileBytes)
		got = int(c.fileBytes)
	} else {
		var f *uring.File
		if f, err = uring.OpenFile(p, unix.O_RDONLY|c.flags(), 0); err == nil {
			got, err = uring.Pread(f, buf.Addr(), uint32(c.fileBytes), 0)
			f.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("%s: reading %s: %w", c.name, p, err)
	}
	if int64(got) < c.fileBytes {
		return fmt.Errorf("%s: %s: short file: %d of %d bytes", c.name, p, got, c.fileBytes)
	}
	if c.headerBytes > 0 {
		want := make([]byte, 32)
		c.header(j.id, j.sub, want)
		if string(b[:32]) != string(want) {
			return fmt.Errorf("%s: %s: header does not name chunk %x/%d", c.name, p, j.id, j.sub)
		}
	}
	payload := b[c.headerBytes:]
	for l := 0; l < c.env.Geometry.Layers; l++ {
		scatterPagesLayer(&c.env, payload, l, j.pages)
	}
	return nil
}

func (c *chunkFiles) writeChunk(buf *uring.Buffer, j chunkJob) error {
	b := buf.Bytes()
	if c.headerBytes > 0 {
		clear(b[:c.headerBytes])
		c.header(j.id, j.sub, b)
	}
	gatherPages(&c.env, b[c.headerBytes:], j.pages)
	p := c.path(j.id, j.sub)
	f, err := uring.OpenFile(p, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|c.flags(), 0o600)
	if err != nil {
		return fmt.Errorf("%s: creating %s: %w", c.name, p, err)
	}
	got, err := uring.Pwrite(f, buf.Addr(), uint32(c.fileBytes), 0)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && int64(got) != c.fileBytes {
		err = fmt.Errorf("short write: %d of %d bytes", got, c.fileBytes)
	}
	if err != nil {
		os.Remove(p)
		return fmt.Errorf("%s: writing %s: %w", c.name, p, err)
	}
	return nil
}

// run hands every chunk of blocks [from, to) of req to the pool and returns
// the lowest block index with an error (to when none) and that error.
func (c *chunkFiles) run(req *Request, write bool, from, to int) (int, error) {
	g := c.env.Geometry
	n := (to - from) * c.perBlock
	if n <= 0 {
		return to, nil
	}
	done := make(chan chunkDone, n)
	fed := make(chan struct{})
	jobs, per, cp := c.jobs, c.perBlock, c.chunkPages
	go func() {
		defer close(fed)
		for b := from; b < to; b++ {
			pages := req.BlockPages(g.ChunkPages, b)
			for s := 0; s < per; s++ {
				jobs <- chunkJob{write: write, id: req.Chain[b], sub: s, block: b, done: done,
					pages: pages[s*cp : (s+1)*cp]}
			}
		}
	}()
	defer func() { <-fed }()
	failed, firstErr := to, error(nil)
	for i := 0; i < n; i++ {
		d := <-done
		if d.err != nil && d.block < failed {
			failed, firstErr = d.block, d.err
		}
	}
	return failed, firstErr
}

func (c *chunkFiles) restore(req *Request) (RestoreResult, error) {
	g := c.env.Geometry
	res := RestoreResult{LayerReady: make([]time.Duration, g.Layers)}
	start := time.Now()
	// A chunk that cannot be read (missing, short, corrupt, an I/O error)
	// makes its block and the rest of the prefix a miss: recomputed and
	// counted in Fallbacks, as a serving system would.
	ok, _ := c.run(req, false, 0, req.Hit)
	end := time.Since(start)
	for l := range res.LayerReady {
		res.LayerReady[l] = end
	}
	res.Blocks = ok
	res.Fallbacks = req.Hit - ok
	res.IOs = int64(req.Hit * c.perBlock)
	res.Runs = req.Hit * c.perBlock
	res.Bytes = int64(ok) * g.ChunkBytes()
	res.ReadBytes = int64(ok*c.perBlock) * c.fileBytes
	if n := len(c.env.Dirs); n > 0 {
		res.ReadBytesPerDir = make([]int64, n)
		for b := 0; b < ok; b++ {
			for s := 0; s < c.perBlock; s++ {
				res.ReadBytesPerDir[c.dirOf(req.Chain[b], s)] += c.fileBytes
			}
		}
	}
	return res, nil
}

func (c *chunkFiles) save(req *Request) (SaveResult, error) {
	g := c.env.Geometry
	ok, err := c.run(req, true, req.Hit, req.SaveEnd)
	res := SaveResult{Blocks: ok - req.Hit, IOs: int64((req.SaveEnd - req.Hit) * c.perBlock)}
	res.Bytes = int64(res.Blocks) * g.ChunkBytes()
	if err != nil {
		// The failed block and everything after it is not stored.
		for b := ok; b < req.SaveEnd; b++ {
			for s := 0; s < c.perBlock; s++ {
				os.Remove(c.path(req.Chain[b], s))
			}
		}
		res.Fallbacks = req.SaveEnd - ok
		if !errors.Is(err, unix.ENOSPC) {
			return res, err
		}
	}
	return res, nil
}

func (c *chunkFiles) evict(ids []uint64) error {
	for _, id := range ids {
		for s := 0; s < c.perBlock; s++ {
			if err := os.Remove(c.path(id, s)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("%s: evicting %x/%d: %w", c.name, id, s, err)
			}
		}
	}
	return nil
}
