package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

// PageCache stores one file per chain block through the page cache, as
// LMCache's local-disk backend does (files spread over Env.Dirs by a hash
// of the chunk id): a save writes the whole chunk (all
// layers) with buffered I/O, a restore opens the file, preads it whole into a
// bounce buffer and copies the pages out. Reads may be served from the page
// cache (recently written blocks), so its device bytes can be below its
// restored bytes; that is this design's advantage and cost (memory), and the
// report shows both.
//
// With direct set it is the "cufile" backend's stand-in: the same file per
// chunk, but read and written with O_DIRECT through an aligned bounce buffer,
// which is what cuFile does in its POSIX compatibility mode (GDS-backed
// LMCache's path where nvidia-fs is absent). The harness's KV memory is host
// memory, so real cuFile (which reads into GPU memory) is not used; reports
// label it.
type PageCache struct {
	direct bool
	env    Env
	bounce *uring.Buffer
	stride int64 // file size: ChunkBytes rounded up to 4 KiB for O_DIRECT
}

// NewPageCache returns the pagecache backend.
func NewPageCache() *PageCache { return &PageCache{} }

// NewCuFileStandIn returns the cufile backend (O_DIRECT bounce stand-in).
func NewCuFileStandIn() *PageCache { return &PageCache{direct: true} }

func (p *PageCache) Name() string {
	if p.direct {
		return "cufile"
	}
	return "pagecache"
}

func (p *PageCache) Available() error { return nil }

func (p *PageCache) DirectIO() bool { return p.direct }

func (p *PageCache) Label() string {
	if p.direct {
		return "one file per chain block, one synchronous O_DIRECT read per file through a host bounce: an older stand-in, not cuFile and not any product's design (lmcache-gds is LMCache's GDS design)"
	}
	return "one file per chain block, one synchronous buffered read per file: an older stand-in, not any product's design (lmcache-disk is LMCache's local disk design)"
}

func (p *PageCache) flags() int {
	if p.direct {
		return unix.O_DIRECT
	}
	return 0
}

func (p *PageCache) Open(env Env) error {
	p.stride = (env.Geometry.ChunkBytes() + 4095) &^ 4095
	b, err := uring.AllocBuffer(int(p.stride))
	if err != nil {
		return fmt.Errorf("%s: bounce buffer: %w", p.Name(), err)
	}
	p.env, p.bounce = env, b
	return nil
}

// path is the file of chain block id, in the directory spreadIndex picks
// among Env.Dirs.
func (p *PageCache) path(id uint64) string {
	dir := p.env.Dir
	if n := len(p.env.Dirs); n > 0 {
		dir = p.env.Dirs[spreadIndex(id, n)]
	}
	return filepath.Join(dir, strconv.FormatUint(id, 16)+".kv")
}

func (p *PageCache) Restore(req *Request) (RestoreResult, error) {
	g := p.env.Geometry
	res := RestoreResult{LayerReady: make([]time.Duration, g.Layers)}
	if len(p.env.Dirs) > 0 {
		res.ReadBytesPerDir = make([]int64, len(p.env.Dirs))
	}
	n := g.ChunkBytes()
	start := time.Now()
	for b := 0; b < req.Hit; b++ {
		f, err := uring.OpenFile(p.path(req.Chain[b]), unix.O_RDONLY|p.flags(), 0)
		if err == nil {
			var got int
			got, err = uring.Pread(f, p.bounce.Addr(), uint32(p.stride), 0)
			f.Close()
			if err == nil && int64(got) < n {
				err = fmt.Errorf("short file: %d of %d bytes", got, n)
			}
		}
		res.IOs++
		if err != nil {
			// The rest of the prefix becomes a miss, counted.
			res.Fallbacks = req.Hit - b
			break
		}
		for l := 0; l < g.Layers; l++ {
			scatterLayer(&p.env, p.bounce.Bytes(), l, req.BlockPages(g.ChunkPages, b))
		}
		res.Blocks++
		res.Runs++
		res.Bytes += n
		res.ReadBytes += p.stride
		if res.ReadBytesPerDir != nil {
			res.ReadBytesPerDir[spreadIndex(req.Chain[b], len(p.env.Dirs))] += p.stride
		}
	}
	end := time.Since(start)
	for l := range res.LayerReady {
		res.LayerReady[l] = end // whole chunks: no layer is ready before all are
	}
	return res, nil
}

func (p *PageCache) Save(req *Request) (SaveResult, error) {
	g := p.env.Geometry
	n := g.ChunkBytes()
	var res SaveResult
	for b := req.Hit; b < req.SaveEnd; b++ {
		gatherBlock(&p.env, p.bounce.Bytes(), req.BlockPages(g.ChunkPages, b))
		f, err := uring.OpenFile(p.path(req.Chain[b]), unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|p.flags(), 0o600)
		if err != nil {
			return res, fmt.Errorf("%s: saving block %d: %w", p.Name(), req.Chain[b], err)
		}
		got, err := uring.Pwrite(f, p.bounce.Addr(), uint32(p.stride), 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		res.IOs++
		if err != nil || int64(got) != p.stride {
			if errors.Is(err, unix.ENOSPC) {
				res.Fallbacks += req.SaveEnd - b
				os.Remove(p.path(req.Chain[b]))
				return res, nil
			}
			return res, fmt.Errorf("%s: writing block %d (%d of %d bytes): %v", p.Name(), req.Chain[b], got, p.stride, err)
		}
		res.Blocks++
		res.Bytes += n
	}
	return res, nil
}

func (p *PageCache) Evict(ids []uint64) error {
	for _, id := range ids {
		if err := os.Remove(p.path(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s: evicting %d: %w", p.Name(), id, err)
		}
	}
	return nil
}

func (p *PageCache) Close() error {
	if p.bounce == nil {
		return nil
	}
	err := p.bounce.Free()
	p.bounce = nil
	return err
}
