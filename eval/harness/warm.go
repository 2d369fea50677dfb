package harness

// Warm start: the store a replay's window starts from is the one the trace's
// earlier requests would have left (Config.Warm), not an empty one. A short
// window of a conversation trace whose turns are minutes apart otherwise has
// almost no prefix reuse, while a serving system that has been running holds
// the previous turns' KV on its disk.

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unsafe"

	"github.com/tutti-io/tutti/internal/trace"
	"golang.org/x/sys/unix"
)

// Warm is the history a replay's window starts warm from (Config.Warm).
type Warm struct {
	// DurationMs is how much history was asked for (--warm-ms).
	DurationMs float64
	// FromMs and ToMs are the history's range on the trace's timestamps:
	// FromMs ≤ timestamp < ToMs, ToMs being the window's first timestamp.
	FromMs, ToMs float64
	// History is every trace request in that range, in trace order. Only
	// the blocks the window references are saved from it (planWarm).
	History []trace.Request
}

// WarmSummary describes the warm start of a replay: what the history was
// and what the shared cache policy made of it. It is the same for every
// backend; what each backend wrote is in its row (BackendResult.Warm*).
type WarmSummary struct {
	DurationMs      float64 `json:"warm_ms"`
	FromMs          float64 `json:"warm_from_ms"` // trace timestamps
	ToMs            float64 `json:"warm_to_ms"`
	HistoryRequests int     `json:"warm_history_requests"` // requests in [FromMs, ToMs)
	HistorySpanMs   float64 `json:"warm_history_span_ms"`  // first to last history timestamp
	FirstLine       int     `json:"warm_first_line,omitempty"`
	LastLine        int     `json:"warm_last_line,omitempty"`
	// UsedRequests are the history requests whose chain starts with a
	// prefix the window looks up (only those save anything).
	UsedRequests int `json:"warm_used_requests"`
	// Blocks is the warm set: distinct blocks of the history that the window
	// references (same prefix chain up to them); Bytes = Blocks × block bytes.
	Blocks int64 `json:"warm_blocks"`
	Bytes  int64 `json:"warm_bytes"`
	// Saves is how many block saves the shared index admitted during the
	// warm-up (Blocks, plus re-saves of blocks the capacity evicted and the
	// history referenced again); EvictedBlocks what it evicted; Resident
	// what it holds when the window starts.
	Saves         int64 `json:"warm_saves"`
	EvictedBlocks int64 `json:"warm_evicted_blocks"`
	Resident      int   `json:"warm_resident_blocks"`
	// Note says in words what the window started from.
	Note string `json:"warm_note"`
}

// warmStep is one history request as the warm-up replays it: its chain cut
// to the leading blocks the window references.
type warmStep struct {
	req   trace.Request // HashIDs cut, InputTokens bounded to them
	chain []uint64
}

// trieKey is one node of the window's prefix tree: a block id under its
// parent node (0 = root).
type trieKey struct {
	parent int32
	id     uint64
}

// planWarm returns the warm-up's steps: every history request that begins
// with a prefix the window looks up, cut to that prefix (a block counts only
// where the history's chain up to it equals a window chain up to it: the
// same chain the index keys). The steps keep the history's order, so
// replaying them through a leaf-first LRU index saves each block of the warm
// set once and leaves it in the order of its last reference (blocks the
// capacity evicts and the history references again are saved again, as the
// history would have). The summary's Saves, EvictedBlocks and Resident come
// from that replay on a fresh Index of capacityBlocks.
func planWarm(w *Warm, window []trace.Request, blockTokens, capacityBlocks int, blockBytes int64) ([]warmStep, WarmSummary) {
	sum := WarmSummary{DurationMs: w.DurationMs, FromMs: w.FromMs, ToMs: w.ToMs, HistoryRequests: len(w.History)}
	if n := len(w.History); n > 0 {
		sum.HistorySpanMs = w.History[n-1].TimestampMs - w.History[0].TimestampMs
		sum.FirstLine, sum.LastLine = w.History[0].Line, w.History[n-1].Line
	}
	nodes := map[trieKey]int32{}
	for _, r := range window {
		var at int32
		for _, id := range r.HashIDs {
			k := trieKey{at, id}
			next, ok := nodes[k]
			if !ok {
				next = int32(len(nodes) + 1)
				nodes[k] = next
			}
			at = next
		}
	}
	var steps []warmStep
	distinct := map[uint64]struct{}{}
	for _, h := range w.History {
		var at int32
		n := 0
		for _, id := range h.HashIDs {
			next, ok := nodes[trieKey{at, id}]
			if !ok {
				break
			}
			at = next
			n++
		}
		if n == 0 {
			continue
		}
		r := h
		r.HashIDs = h.HashIDs[:n:n]
		r.InputTokens = min(h.InputTokens, n*blockTokens)
		steps = append(steps, warmStep{req: r, chain: r.HashIDs})
		for _, id := range r.HashIDs {
			distinct[id] = struct{}{}
		}
	}
	sum.UsedRequests = len(steps)
	sum.Blocks = int64(len(distinct))
	sum.Bytes = sum.Blocks * blockBytes
	idx := NewIndex(capacityBlocks)
	for _, s := range steps {
		hit := idx.Lookup(s.chain)
		end, evict := idx.Admit(s.chain, hit)
		sum.EvictedBlocks += int64(len(evict))
		if end > hit {
			sum.Saves += int64(end - hit)
			idx.Insert(s.chain, hit, end)
		}
	}
	sum.Resident = idx.Len()
	span := fmt.Sprintf("the trace's requests with timestamps in [%.0f, %.0f) ms (%.0f s before the window)",
		w.FromMs, w.ToMs, w.DurationMs/1000)
	switch {
	case len(w.History) == 0:
		sum.Note = fmt.Sprintf("--warm-ms %.0f asked for a warm start, but the trace has no requests in [%.0f, %.0f) ms before the window: the window started cold (empty stores), as without --warm-ms",
			w.DurationMs, w.FromMs, w.ToMs)
	case len(steps) == 0:
		sum.Note = fmt.Sprintf("the window started cold: none of the %d history requests (%s) shares a prefix with the window, so nothing was saved before it",
			len(w.History), span)
	default:
		evicted := ""
		if sum.EvictedBlocks > 0 {
			evicted = fmt.Sprintf("; the capacity evicted %d blocks during the warm-up (leaf-first LRU), %d stayed", sum.EvictedBlocks, sum.Resident)
		}
		sum.Note = fmt.Sprintf("the window started WARM: before it, every caching backend saved (untimed, through its own save path) the %d blocks (%d MiB) that %d of the %d history requests (%s, lines %d-%d) share with the window, in history order%s; recompute starts with nothing",
			sum.Blocks, sum.Bytes>>20, len(steps), len(w.History), span, sum.FirstLine, sum.LastLine, evicted)
	}
	return steps, sum
}

// warmStats is what one backend's warm-up did.
type warmStats struct {
	savedBlocks, savedBytes int64
	evicted                 int64
	fallbacks               int64
	seconds                 float64
	syncedFiles             int
	droppedFiles            int
	residentAfterDrop       int64 // page-cache bytes of the backend's files still resident after the drop
}

// warmUp saves the warm set into backend b before the window, untimed: the
// steps go through the same index (the shared one, or the backend's own when
// it is SelfIndexed) and the backend's own Save, with the pages filled with
// the blocks' deterministic KV (internal/kvdata) as a prefill would have left
// them, so the window's restores read and verify what a real save wrote. No
// prefill runs. Afterwards every file in the backend's directories is
// fsynced (no dirty page of the warm-up is written back during the window),
// and a backend that reads through the page cache (not DirectIO) has its
// files dropped from the page cache (fadvise DONTNEED per file), so its
// window restores of warm blocks come from the device.
func warmUp(ctx context.Context, steps []warmStep, b Backend, kv *KVMemory, index *Index, dirs []string) (warmStats, error) {
	var st warmStats
	g := kv.Geometry
	self, selfIndexed := b.(SelfIndexed)
	t0 := time.Now()
	for i, s := range steps {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		pages, err := kv.Alloc(len(s.chain) * g.ChunkPages)
		if err != nil {
			return st, fmt.Errorf("warm-up request %d (trace line %d): %w", i, s.req.Line, err)
		}
		err = saveWarmStep(&st, i, s, b, kv, index, self, selfIndexed, pages)
		kv.Release(pages)
		if err != nil {
			return st, err
		}
	}
	var err error
	st.syncedFiles, st.droppedFiles, st.residentAfterDrop, err = settleFiles(dirs, !isDirect(b))
	if err != nil {
		return st, fmt.Errorf("after the warm-up: %w", err)
	}
	st.seconds = time.Since(t0).Seconds()
	return st, nil
}

func isDirect(b Backend) bool {
	d, ok := b.(DirectIO)
	return ok && d.DirectIO()
}

// saveWarmStep replays one history request on b: lookup (touching the
// LRU), admission and eviction by the shared index (or b's own), the new
// blocks' KV written into the pages and saved.
func saveWarmStep(st *warmStats, i int, s warmStep, b Backend, kv *KVMemory, index *Index, self SelfIndexed, selfIndexed bool, pages []int32) error {
	g := kv.Geometry
	req := &Request{Seq: -1 - i, Trace: s.req, Chain: s.chain, Pages: pages}
	if selfIndexed {
		req.Hit = self.Lookup(req.Chain)
	} else {
		req.Hit = index.Lookup(req.Chain)
	}
	end := len(req.Chain)
	if !selfIndexed {
		var evict []uint64
		end, evict = index.Admit(req.Chain, req.Hit)
		if err := b.Evict(evict); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
		st.evicted += int64(len(evict))
	}
	req.SaveEnd = end
	if end <= req.Hit {
		return nil
	}
	for blk := req.Hit; blk < end; blk++ {
		kv.FillBlock(req.Chain[blk], req.BlockPages(g.ChunkPages, blk))
	}
	if hs, ok := b.(HostSyncer); ok {
		if err := hs.FromHost(req); err != nil {
			return fmt.Errorf("warm-up request %d: copying KV to the backend: %w", i, err)
		}
	}
	sr, err := b.Save(req)
	if err != nil {
		return fmt.Errorf("warm-up request %d (trace line %d): save: %w", i, s.req.Line, err)
	}
	st.savedBlocks += int64(sr.Blocks)
	st.savedBytes += sr.Bytes
	st.fallbacks += int64(sr.Fallbacks)
	if !selfIndexed {
		index.Insert(req.Chain, req.Hit, req.Hit+sr.Blocks)
	}
	return nil
}

// settleFiles fsyncs every regular file under dirs (and the directories),
// and with drop set asks the kernel to drop each file's pages from the page
// cache (POSIX_FADV_DONTNEED, after the fsync: dirty pages are not dropped).
// Only the backend's own files are touched, never the machine's caches. It
// returns the regular files synced and dropped and the bytes of them still resident
// in the page cache afterwards (mincore; the kernel may keep pages another
// mapping holds).
func settleFiles(dirs []string, drop bool) (synced, dropped int, resident int64, err error) {
	for _, root := range dirs {
		werr := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.Type().IsRegular() && !d.IsDir() {
				return nil
			}
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			if err := f.Sync(); err != nil {
				return fmt.Errorf("fsync %s: %w", path, err)
			}
			if d.IsDir() {
				return nil
			}
			synced++
			if !drop {
				return nil
			}
			if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
				return fmt.Errorf("fadvise DONTNEED %s: %w", path, err)
			}
			dropped++
			n, err := residentBytes(f)
			if err != nil {
				return fmt.Errorf("mincore %s: %w", path, err)
			}
			resident += n
			return nil
		})
		if werr != nil {
			return synced, dropped, resident, werr
		}
	}
	return synced, dropped, resident, nil
}

// residentBytes is how many bytes of f's pages are in the page cache
// (mmap + mincore; the mapping is never touched, so it faults nothing in).
func residentBytes(f *os.File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	size := fi.Size()
	if size == 0 {
		return 0, nil
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, err
	}
	defer unix.Munmap(m)
	page := int64(os.Getpagesize())
	vec := make([]byte, (size+page-1)/page)
	// x/sys has no mincore wrapper
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(size), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		return 0, e
	}
	var n int64
	for _, v := range vec {
		if v&1 != 0 {
			n += page
		}
	}
	return n, nil
}

// warmBackend runs b's warm-up (none for recompute, which keeps nothing) and
// records it in br.
func warmBackend(ctx context.Context, br *BackendResult, steps []warmStep, b Backend, kv *KVMemory, index *Index, dirs []string) error {
	if b.Name() == "recompute" {
		br.WarmNote = "no store: no warm-up"
		return nil
	}
	if len(steps) == 0 {
		br.WarmNote = "nothing to save: started cold"
		return nil
	}
	st, err := warmUp(ctx, steps, b, kv, index, dirs)
	if err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	br.WarmSavedBlocks, br.WarmSavedBytes, br.WarmSeconds = st.savedBlocks, st.savedBytes, st.seconds
	br.WarmEvictedBlocks, br.WarmFallbacks = st.evicted, st.fallbacks
	var notes []string
	if _, self := b.(SelfIndexed); self {
		notes = append(notes, "its own index admitted and evicted (evictions not counted here)")
	}
	notes = append(notes, fmt.Sprintf("%d files fsynced", st.syncedFiles))
	if st.droppedFiles > 0 {
		notes = append(notes, fmt.Sprintf("%d files dropped from the page cache (fadvise DONTNEED): %d bytes still resident",
			st.droppedFiles, st.residentAfterDrop))
	}
	br.WarmNote = strings.Join(notes, "; ")
	return nil
}
