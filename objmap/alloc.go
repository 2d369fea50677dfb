package objmap

import (
	"fmt"
	"strings"

	"github.com/google/btree"
)

// extent is a byte range [off, off+n) of one pool file.
type extent struct{ off, n int64 }

func (e extent) end() int64 { return e.off + e.n }

const btreeDegree = 16

// fileSpace is the free space of one pool file, in two B-trees over the same
// extents: byOff (ordered by offset) finds neighbours to coalesce on free;
// bySize (ordered by size, then offset) answers best-fit in O(log n).
//
// Best-fit rather than first-fit: runs have very different sizes (one chunk
// to MaxRunChunks), and best-fit leaves the large extents whole for long
// runs, so a long prefix is split into fewer runs (fewer reads per layer).
// Its classic weakness, slivers, does not arise here because every size is a
// multiple of BlockBytes and the slivers that remain are coalesced on free.
type fileSpace struct {
	sizeBytes int64
	freeBytes int64
	byOff     *btree.BTreeG[extent]
	bySize    *btree.BTreeG[extent]
}

func newFileSpace(sizeBytes int64) *fileSpace {
	f := &fileSpace{
		sizeBytes: sizeBytes,
		byOff:     btree.NewG(btreeDegree, func(a, b extent) bool { return a.off < b.off }),
		bySize: btree.NewG(btreeDegree, func(a, b extent) bool {
			if a.n != b.n {
				return a.n < b.n
			}
			return a.off < b.off
		}),
	}
	return f
}

func (f *fileSpace) add(e extent) {
	f.byOff.ReplaceOrInsert(e)
	f.bySize.ReplaceOrInsert(e)
	f.freeBytes += e.n
}

func (f *fileSpace) remove(e extent) {
	f.byOff.Delete(e)
	f.bySize.Delete(e)
	f.freeBytes -= e.n
}

// insert returns e to the free space, merged with adjacent free extents. An
// overlap with free space (a double free) is an error and changes nothing.
func (f *fileSpace) insert(e extent) error {
	if e.n <= 0 || e.off < 0 || e.end() > f.sizeBytes || e.off%BlockBytes != 0 || e.n%BlockBytes != 0 {
		return fmt.Errorf("objmap: freeing [%d, +%d) of a %d-byte file: not an aligned extent inside it", e.off, e.n, f.sizeBytes)
	}
	var prev, next extent
	var hasPrev, hasNext bool
	f.byOff.DescendLessOrEqual(extent{off: e.off}, func(x extent) bool { prev, hasPrev = x, true; return false })
	f.byOff.AscendGreaterOrEqual(extent{off: e.off}, func(x extent) bool { next, hasNext = x, true; return false })
	if hasPrev && prev.end() > e.off || hasNext && next.off < e.end() {
		return fmt.Errorf("objmap: freeing [%d, +%d): overlaps free space (double free)", e.off, e.n)
	}
	m := e
	if hasPrev && prev.end() == e.off {
		f.remove(prev)
		m = extent{off: prev.off, n: prev.n + m.n}
	}
	if hasNext && next.off == e.end() {
		f.remove(next)
		m.n += next.n
	}
	f.add(m)
	return nil
}

// take removes the best-fitting extent of at least n bytes and returns its
// first n bytes (the rest stays free).
func (f *fileSpace) take(n int64) (int64, bool) {
	var got extent
	var ok bool
	f.bySize.AscendGreaterOrEqual(extent{n: n}, func(x extent) bool { got, ok = x, true; return false })
	if !ok {
		return 0, false
	}
	f.remove(got)
	if got.n > n {
		f.add(extent{off: got.off + n, n: got.n - n})
	}
	return got.off, true
}

// carve removes exactly e from the free space (recovery marks a journaled run
// used). It fails if any byte of e is not free.
func (f *fileSpace) carve(e extent) error {
	if e.n <= 0 || e.off < 0 || e.end() > f.sizeBytes || e.off%BlockBytes != 0 || e.n%BlockBytes != 0 {
		return fmt.Errorf("extent [%d, +%d) is not an aligned extent inside the %d-byte file", e.off, e.n, f.sizeBytes)
	}
	var c extent
	var ok bool
	f.byOff.DescendLessOrEqual(extent{off: e.off}, func(x extent) bool { c, ok = x, true; return false })
	if !ok || c.end() < e.end() {
		return fmt.Errorf("extent [%d, +%d) overlaps space already in use", e.off, e.n)
	}
	f.remove(c)
	if c.off < e.off {
		f.add(extent{off: c.off, n: e.off - c.off})
	}
	if c.end() > e.end() {
		f.add(extent{off: e.end(), n: c.end() - e.end()})
	}
	return nil
}

func (f *fileSpace) largest() int64 {
	var n int64
	f.bySize.Descend(func(x extent) bool { n = x.n; return false })
	return n
}

// span is one allocated extent sized for a run of chunks chunks: in space
// (stripe group) space, with its header in the group's file at position
// home.
type span struct {
	space, home int
	off, n      int64
	chunks      int
}

// quarantined is freed space that may not be reused until the journal record
// that frees it (lsn) is durable.
type quarantined struct {
	space int
	ext   extent
	lsn   uint64
}

// allocator hands out run extents from the pool's spaces, the stripe groups
// of the Layout (one per pool file when runs lie on one device): an extent
// of a space is the same byte range of each of the group's files. A run's
// home file (which holds its header, and where its layer 0 lies) is sought
// round-robin over the pool files, which lie in directory f % Dirs: so
// consecutive runs start on consecutive devices, and where a run spreads
// over fewer devices than the store has, consecutive runs take different
// groups. It is not safe for
// concurrent use (Map locks it).
//
// Freed space goes through quarantine: Free journals a "free run" record and
// the space returns to the free lists only once that record is durable. If it
// were reused earlier, a crash before the record reached the disk would
// replay the old run's commit record without its free, and the old header may
// still verify while the new run's payload has overwritten its objects: the
// old run would be served with someone else's bytes. Once the free record is
// durable, replay forgets the old run before the new one can be seen.
type allocator struct {
	lay        Layout
	spaces     []*fileSpace
	cursor     int           // the pool file the next run's home is sought from
	quarantine []quarantined // ordered by lsn
}

// newAllocator is the free space of lay's pool of files of fileBytes each.
func newAllocator(lay Layout, fileBytes int64) *allocator {
	a := &allocator{lay: lay}
	for range lay.spaces() {
		f := newFileSpace(fileBytes)
		if fileBytes >= BlockBytes {
			f.add(extent{0, fileBytes &^ (BlockBytes - 1)})
		}
		a.spaces = append(a.spaces, f)
	}
	return a
}

// place makes a span of the space of pool file f, f its home, and moves
// the cursor past f.
func (a *allocator) place(f int, off, n int64, chunks int) span {
	s := a.lay.space(f)
	a.cursor = (f + 1) % a.lay.Files()
	return span{space: s, home: f - a.lay.homeFile(s, 0), off: off, n: n, chunks: chunks}
}

// file is the home pool file of sp.
func (sp span) file(lay Layout) int { return lay.homeFile(sp.space, sp.home) }

// alloc reserves room for up to chunks chunks as runs of at most maxRun
// chunks and at most maxRuns runs. It never blocks and never fails: when the
// pool cannot hold everything it returns what fit (possibly nothing); the
// caller compares the chunk total. Each run takes the best-fitting extent of
// the space of the next pool file in turn that can hold it, that file its
// home; when no space can hold a whole run, the largest extent anywhere
// takes as many chunks as fit.
func (a *allocator) alloc(chunks, maxRun, maxRuns int) []span {
	var out []span
	rem := chunks
	for rem > 0 && len(out) < maxRuns {
		n := min(rem, maxRun)
		need := a.lay.RunBytes(n)
		placed := false
		for t := range a.lay.Files() {
			f := (a.cursor + t) % a.lay.Files()
			if off, ok := a.spaces[a.lay.space(f)].take(need); ok {
				out = append(out, a.place(f, off, need, n))
				rem -= n
				placed = true
				break
			}
		}
		if placed {
			continue
		}
		best, bestN := -1, int64(0)
		for si, f := range a.spaces {
			if l := f.largest(); l > bestN {
				best, bestN = si, l
			}
		}
		k := 0
		if best >= 0 {
			k = min(a.lay.ChunksThatFit(bestN), n)
		}
		if k == 0 {
			break
		}
		need = a.lay.RunBytes(k)
		off, _ := a.spaces[best].take(need)
		out = append(out, a.place(a.lay.homeFile(best, a.cursor%a.lay.Width()), off, need, k))
		rem -= k
	}
	return out
}

// free returns the extent e of the run whose home is file at once; only for
// space no durable record refers to (an aborted reservation, or recovery).
func (a *allocator) free(file int, e extent) error {
	if file < 0 || file >= a.lay.Files() {
		return fmt.Errorf("objmap: freeing extent in file %d of %d", file, a.lay.Files())
	}
	return a.spaces[a.lay.space(file)].insert(e)
}

// quarantineFree holds the extent e of the run whose home is file until
// lsn is durable (see allocator).
func (a *allocator) quarantineFree(file int, e extent, lsn uint64) {
	a.quarantine = append(a.quarantine, quarantined{space: a.lay.space(file), ext: e, lsn: lsn})
}

// release returns quarantined space whose free record is durable.
func (a *allocator) release(durableLSN uint64) error {
	i := 0
	var firstErr error
	for ; i < len(a.quarantine) && a.quarantine[i].lsn <= durableLSN; i++ {
		q := a.quarantine[i]
		if err := a.spaces[q.space].insert(q.ext); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	a.quarantine = append(a.quarantine[:0], a.quarantine[i:]...)
	return firstErr
}

// carve marks the extent e of the run whose home is file used.
func (a *allocator) carve(file int, e extent) error {
	if file < 0 || file >= a.lay.Files() {
		return fmt.Errorf("file index %d, the pool has %d files", file, a.lay.Files())
	}
	return a.spaces[a.lay.space(file)].carve(e)
}

// freeBytes is the free bytes of the pool (every file of a space counted).
func (a *allocator) freeBytes() int64 {
	var n int64
	for _, f := range a.spaces {
		n += f.freeBytes
	}
	return n * int64(a.lay.Width())
}

// quarantinedBytes is the pool bytes in quarantine (every file counted).
func (a *allocator) quarantinedBytes() int64 {
	var n int64
	for _, q := range a.quarantine {
		n += q.ext.n
	}
	return n * int64(a.lay.Width())
}

// String prints the free lists (offset order) and the quarantine, for tests;
// a space is named "file" when it is one (run width 1).
func (a *allocator) String() string {
	var sb strings.Builder
	name := "file"
	if a.lay.Width() > 1 {
		name = "space"
	}
	for si, f := range a.spaces {
		fmt.Fprintf(&sb, "%s %d: free %d:", name, si, f.freeBytes)
		f.byOff.Ascend(func(e extent) bool { fmt.Fprintf(&sb, " [%d,+%d)", e.off, e.n); return true })
		sb.WriteByte('\n')
	}
	if len(a.quarantine) > 0 {
		sb.WriteString("quarantine:")
		for _, q := range a.quarantine {
			fmt.Fprintf(&sb, " f%d[%d,+%d)@%d", q.space, q.ext.off, q.ext.n, q.lsn)
		}
		sb.WriteByte('\n')
	}
	return sb.String()
}
