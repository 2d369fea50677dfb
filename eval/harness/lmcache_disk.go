package harness

import "fmt"

// LMCacheDisk is the design of LMCache's local disk backend
// (LocalDiskBackend), implemented here. The facts it follows:
//   - chunks of LMCache's default chunk_size, 256 tokens: a 512-token chain
//     block is two chunks;
//   - one file per chunk holding every layer's K and V of its tokens (the
//     whole chunk is the unit of storage and of retrieval: no layer of a
//     chunk is usable before the file is read);
//   - buffered file I/O through the page cache (LMCache's default: no
//     O_DIRECT), so recently written chunks may be read from memory;
//   - a pool of I/O threads serving the chunks of a request (4 here);
//   - host staging, then copy: a chunk is read into a host buffer and
//     copied from there into the engine's KV pages (LMCache reads into its
//     CPU memory pool, then copies to the GPU).
//
// The harness's engine KV memory is host memory, so the final copy is a
// host-to-host copy here.
type LMCacheDisk struct{ c chunkFiles }

// LMCache's chunk_size default and the I/O threads of this implementation.
const (
	lmcacheChunkTokens = 256
	lmcacheDiskThreads = 4
)

// NewLMCacheDisk returns the lmcache-disk backend.
func NewLMCacheDisk() *LMCacheDisk {
	return &LMCacheDisk{c: chunkFiles{name: "lmcache-disk", threads: lmcacheDiskThreads}}
}

func (b *LMCacheDisk) Name() string     { return "lmcache-disk" }
func (b *LMCacheDisk) Available() error { return nil }
func (b *LMCacheDisk) DirectIO() bool   { return false }

func (b *LMCacheDisk) Label() string {
	return fmt.Sprintf("the design of LMCache's local disk backend, implemented here: one file per %d-token chunk (LMCache's default chunk_size) holding every layer, buffered I/O through the page cache, %d I/O threads, host staging then copy into the KV pages",
		lmcacheChunkTokens, lmcacheDiskThreads)
}

func (b *LMCacheDisk) Open(env Env) error {
	pt := env.Geometry.PageTokens
	b.c.chunkPages = max(1, lmcacheChunkTokens/pt)
	return b.c.open(env)
}

func (b *LMCacheDisk) Restore(req *Request) (RestoreResult, error) { return b.c.restore(req) }
func (b *LMCacheDisk) Save(req *Request) (SaveResult, error)       { return b.c.save(req) }
func (b *LMCacheDisk) Evict(ids []uint64) error                    { return b.c.evict(ids) }
func (b *LMCacheDisk) Close() error                                { return b.c.close() }
