package harness

import "fmt"

// VLLMFS is the design of vLLM's file-system offload tier (the offloading
// connector's file backend), implemented here. The facts it follows:
//   - one file per KV block, vLLM's block of block_size tokens (16 by
//     default: one engine page here), holding every layer of the block;
//   - 16 reader threads, each a blocking read of one file at a time;
//   - O_DIRECT reads and writes into a host staging buffer per thread, then
//     a copy into the KV pages (vLLM's CPU tier stages in host memory).
type VLLMFS struct{ c chunkFiles }

// vllmFSThreads is the reader thread count of vLLM's file tier.
const vllmFSThreads = 16

// NewVLLMFS returns the vllm-fs backend.
func NewVLLMFS() *VLLMFS {
	return &VLLMFS{c: chunkFiles{name: "vllm-fs", chunkPages: 1, direct: true, threads: vllmFSThreads}}
}

func (b *VLLMFS) Name() string     { return "vllm-fs" }
func (b *VLLMFS) Available() error { return nil }
func (b *VLLMFS) DirectIO() bool   { return true }

func (b *VLLMFS) Label() string {
	return fmt.Sprintf("the design of vLLM's file-system offload tier, implemented here: one file per %d-token KV block (vLLM's block_size default) holding every layer, O_DIRECT, %d reader threads, host staging then copy into the KV pages",
		b.blockTokens(), vllmFSThreads)
}

func (b *VLLMFS) blockTokens() int {
	if pt := b.c.env.Geometry.PageTokens; pt > 0 {
		return pt
	}
	return 16
}

func (b *VLLMFS) Open(env Env) error                          { return b.c.open(env) }
func (b *VLLMFS) Restore(req *Request) (RestoreResult, error) { return b.c.restore(req) }
func (b *VLLMFS) Save(req *Request) (SaveResult, error)       { return b.c.save(req) }
func (b *VLLMFS) Evict(ids []uint64) error                    { return b.c.evict(ids) }
func (b *VLLMFS) Close() error                                { return b.c.close() }
