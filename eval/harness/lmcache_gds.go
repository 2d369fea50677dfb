package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kernels/testkit"
	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

// LMCacheGDS is the design of LMCache's GDS backend (GdsBackend),
// implemented here. The facts it follows:
//   - the chunks of LMCache's default chunk_size, 256 tokens, one file per
//     chunk holding every layer, after a small header naming the chunk
//     (4 KiB here: the alignment unit of O_DIRECT and cuFile);
//   - reads through cuFile's batch API straight into GPU memory where cuFile
//     registers the file (nvidia-fs and a file system it supports), and
//     through cuFile's compatibility path where it refuses: POSIX O_DIRECT
//     reads into a host bounce buffer, then a copy;
//   - the same pool of I/O threads as the local disk backend (4).
//
// Which path ran is said per row (Label). On a machine without a GPU only
// the compatibility path runs (the CPU read path: O_DIRECT pread into host
// staging, then a copy into the KV pages). With a GPU and cuFile
// registering the store's files, each chunk is read by cuFile's batch API
// into a device staging buffer of its thread; the harness's KV memory is
// host memory, so the chunk is then copied to the host staging buffer and
// from there into the pages, inside the timed restore: a cost the real
// design (KV in HBM) does not pay, said in the label.
type LMCacheGDS struct {
	c      chunkFiles
	path   string // "cufile batch", "cufile compat" or "cpu compat"
	reason string
	dev    []uint64 // per thread: device staging (cuFile variant)
}

// NewLMCacheGDS returns the lmcache-gds backend.
func NewLMCacheGDS() *LMCacheGDS {
	return &LMCacheGDS{c: chunkFiles{name: "lmcache-gds", headerBytes: 4096, direct: true, threads: lmcacheDiskThreads}}
}

func (b *LMCacheGDS) Name() string     { return "lmcache-gds" }
func (b *LMCacheGDS) Available() error { return nil }
func (b *LMCacheGDS) DirectIO() bool   { return true }

func (b *LMCacheGDS) Label() string {
	design := fmt.Sprintf("the design of LMCache's GDS backend, implemented here: one file per %d-token chunk (LMCache's default chunk_size) with a 4 KiB header, every layer in it, %d I/O threads",
		lmcacheChunkTokens, lmcacheDiskThreads)
	switch b.path {
	case "cufile batch":
		return design + "; read path: cuFile batch API into device staging (cuFile registered the store's files), then device-to-host and a copy into the host KV pages (the harness's KV memory is host memory)"
	case "cufile compat":
		return design + "; read path: cuFile's compatibility path (POSIX O_DIRECT into host staging, then a copy): cuFile refused the store's files: " + b.reason
	case "cpu compat":
		return design + "; read path: the CPU compatibility path only (O_DIRECT into host staging, then a copy): " + b.reason
	}
	return design
}

func (b *LMCacheGDS) Open(env Env) error {
	b.c.chunkPages = max(1, lmcacheChunkTokens/env.Geometry.PageTokens)
	if err := b.c.open(env); err != nil {
		return err
	}
	b.path, b.reason = b.pickPath()
	if b.path != "cufile batch" {
		return nil
	}
	for i := 0; i < b.c.threads; i++ {
		d, err := kernels.DevAlloc(b.c.fileBytes)
		if err != nil {
			return fmt.Errorf("lmcache-gds: device staging: %w", err)
		}
		b.dev = append(b.dev, d)
	}
	b.c.readFile = func(worker int, path string, dst uintptr, n int64) error {
		d := b.dev[worker]
		if err := testkit.CuFileBatchRead(path, []uint64{0}, []uint64{0}, []uint32{uint32(n)}, d, n); err != nil {
			return err
		}
		return kernels.CopyToHost(dst, d, n)
	}
	return nil
}

// pickPath asks cuFile to register a file in the store (written like a
// chunk) and returns the read path and why.
func (b *LMCacheGDS) pickPath() (path, reason string) {
	if err := kernels.Init(0); err != nil {
		return "cpu compat", fmt.Sprintf("no GPU here (%v)", err)
	}
	probe := filepath.Join(b.c.env.Dir, "cufile-probe.kv")
	defer os.Remove(probe)
	if err := writeProbe(probe, b.c.fileBytes); err != nil {
		return "cufile compat", fmt.Sprintf("writing a probe file: %v", err)
	}
	if code, err := testkit.CuFileProbe(probe); err != nil {
		return "cufile compat", fmt.Sprintf("cuFile error %d: %v", code, err)
	}
	return "cufile batch", ""
}

func writeProbe(path string, n int64) error {
	buf, err := uring.AllocBuffer(int(n))
	if err != nil {
		return err
	}
	defer buf.Free()
	f, err := uring.OpenFile(path, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_DIRECT, 0o600)
	if err != nil {
		return err
	}
	_, err = uring.Pwrite(f, buf.Addr(), uint32(n), 0)
	return errors.Join(err, f.Close())
}

func (b *LMCacheGDS) Restore(req *Request) (RestoreResult, error) { return b.c.restore(req) }
func (b *LMCacheGDS) Save(req *Request) (SaveResult, error)       { return b.c.save(req) }
func (b *LMCacheGDS) Evict(ids []uint64) error                    { return b.c.evict(ids) }

func (b *LMCacheGDS) Close() error {
	errs := []error{b.c.close()}
	for _, d := range b.dev {
		errs = append(errs, kernels.DevFree(d))
	}
	b.dev = nil
	return errors.Join(errs...)
}
