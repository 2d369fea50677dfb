package objmap

// Prewriting the pool. fallocate leaves a pool file's blocks unwritten
// (allocated, reading as zeros), and the file system converts them at the
// first write that lands in each: ext4 does it at every O_DIRECT write's
// completion, under the inode's extent lock, so a fresh store's saves write
// at a fraction of what they write over blocks written before
// (BENCHMARKS.md, What the defaults rest on). Options.WritePool pays for the whole pool
// at creation; Prewrite instead writes zeros over the free, unwritten parts
// of the pool piece by piece, when its caller finds the devices idle, and
// what the saves write meanwhile converts the rest.
//
// The unwritten ranges are what FIEMAP reported for each pool file at Open
// (FIEMAP_EXTENT_UNWRITTEN), less what Prewrite wrote since. A range a run
// was allocated in is dropped when Prewrite reaches it (the run's writes
// convert it; an aborted reservation leaves it unwritten, and it is found
// again at the next Open). The list is a hint for speed only: Prewrite
// writes nothing but free space, which it takes out of the allocator while
// it writes, so no run can be placed there meanwhile, and quarantined space
// (freed, its free record not yet durable) is not free.

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

const (
	// PrewriteMaxBytes bounds one Prewrite call's write.
	PrewriteMaxBytes = 8 << 20
	// maxFiemapExtents bounds the extents read from one pool file at Open: a
	// file more fragmented than that is prewritten as far as its first
	// ones, and the rest is converted by the saves.
	maxFiemapExtents = 1 << 16
	fiemapBatch      = 256
)

// ErrPrewriteUnsupported is wrapped by PrewriteNote's cause when the file
// system does not report extents: nothing is prewritten.
var ErrPrewriteUnsupported = errors.New("objmap: the file system does not report unwritten extents (FIEMAP)")

// prewriteState is the Map's prewrite bookkeeping (under Map.mu).
type prewriteState struct {
	unwritten [][]extent // per pool file, sorted and disjoint
	cursor    int        // next file in turn
	note      string     // why nothing is prewritten, or empty
	written   int64      // bytes Prewrite wrote
	zero      *uring.Buffer
	inflight  int // Prewrite writes outside the lock (Close waits: m.prewriteDone)
}

// scanUnwritten fills the unwritten lists of the pool files (Open, after
// recovery). A file whose extents cannot be read leaves the Map with nothing
// to prewrite there, said by PrewriteNote.
func (m *Map) scanUnwritten() {
	p := &m.pre
	p.unwritten = make([][]extent, len(m.files))
	if m.readOnly || m.opts.WritePool {
		return
	}
	for i, f := range m.files {
		u, err := fiemapUnwritten(int(f.FD), m.fileSize)
		if err != nil {
			p.note = fmt.Sprintf("pool file %d: %v", i, err)
			continue
		}
		p.unwritten[i] = u
	}
}

// PrewriteLeftBytes is the pool's unwritten bytes as the Map knows them
// (those under runs included until Prewrite reaches them).
func (m *Map) PrewriteLeftBytes() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for _, us := range m.pre.unwritten {
		for _, u := range us {
			n += u.n
		}
	}
	return n
}

// PrewrittenBytes is what Prewrite wrote since Open.
func (m *Map) PrewrittenBytes() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pre.written
}

// PrewriteNote says why part of the pool is not prewritten (FIEMAP
// unsupported, a failed scan); empty otherwise.
func (m *Map) PrewriteNote() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pre.note
}

// Prewrite writes zeros (O_DIRECT, from off-heap memory) over at most
// maxBytes (at most PrewriteMaxBytes) of the next free, unwritten piece of
// the pool, taking the pool files in turn, and returns the bytes written:
// 0 with a nil error when nothing is left. It blocks for the one write. On a
// write error the piece goes back to the free space, is no longer prewritten
// and the error is returned; the pool's contents are unchanged either way
// (the piece was free). Safe to call concurrently with every other method;
// Close waits for a Prewrite in progress.
func (m *Map) Prewrite(maxBytes int64) (int64, error) {
	maxBytes = min(maxBytes, PrewriteMaxBytes) &^ (BlockBytes - 1)
	if maxBytes <= 0 {
		return 0, fmt.Errorf("objmap: prewrite of %d bytes: want at least %d", maxBytes, BlockBytes)
	}
	m.mu.Lock()
	if m.closed || m.readOnly {
		m.mu.Unlock()
		if m.readOnly {
			return 0, ErrReadOnly
		}
		return 0, ErrClosed
	}
	if m.pre.zero == nil {
		b, err := uring.AllocBuffer(PrewriteMaxBytes)
		if err != nil {
			m.mu.Unlock()
			return 0, fmt.Errorf("objmap: prewrite buffer: %w", err)
		}
		m.pre.zero = b
	}
	fi, e, ok := m.nextPrewrite(maxBytes)
	if !ok {
		m.mu.Unlock()
		return 0, nil
	}
	m.pre.inflight++
	f, zero := m.files[fi], m.pre.zero
	m.mu.Unlock()

	n, err := uring.Pwrite(f, zero.Addr(), uint32(e.n), uint64(e.off))
	if err == nil && int64(n) != e.n {
		err = fmt.Errorf("%d of %d bytes", n, e.n)
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	m.pre.inflight--
	if m.pre.inflight == 0 {
		m.prewriteDone.Broadcast()
	}
	if ferr := m.alloc.free(fi, e); ferr != nil && err == nil {
		err = ferr
	}
	if err != nil {
		return 0, fmt.Errorf("objmap: prewrite of pool file %d [%d, +%d): %w", fi, e.off, e.n, err)
	}
	m.pre.written += e.n
	return e.n, nil
}

// waitPrewrite (under m.mu) returns once no Prewrite write is in progress.
func (m *Map) waitPrewrite() {
	for m.pre.inflight > 0 {
		m.prewriteDone.Wait()
	}
}

// nextPrewrite takes the next piece to prewrite out of the free space
// (under m.mu): the first free part of the first unwritten range of the
// next file in turn that has one, at most maxBytes. What of an unwritten
// range precedes that part is under runs and is dropped.
func (m *Map) nextPrewrite(maxBytes int64) (int, extent, bool) {
	p := &m.pre
	for t := range p.unwritten {
		fi := (p.cursor + t) % len(p.unwritten)
		// The file's free space is its stripe group's: the piece is taken
		// out of every file of the group while it is written in this one.
		fs := m.alloc.spaces[m.lay.space(fi)]
		us := p.unwritten[fi]
		for len(us) > 0 {
			u := us[0]
			piece, ok := firstFreeIn(fs, u)
			if !ok {
				us = us[1:]
				continue
			}
			piece.n = min(piece.n, maxBytes)
			if rest := u.end() - piece.end(); rest > 0 {
				us[0] = extent{off: piece.end(), n: rest}
			} else {
				us = us[1:]
			}
			if err := fs.carve(piece); err != nil {
				// firstFreeIn found it free under the same lock.
				panic(fmt.Sprintf("objmap: prewrite: %v", err))
			}
			p.unwritten[fi] = us
			p.cursor = (fi + 1) % len(p.unwritten)
			return fi, piece, true
		}
		p.unwritten[fi] = us
	}
	return 0, extent{}, false
}

// firstFreeIn is the first free part of u (clipped to u).
func firstFreeIn(fs *fileSpace, u extent) (extent, bool) {
	var got extent
	var ok bool
	fs.byOff.DescendLessOrEqual(extent{off: u.off}, func(x extent) bool {
		if x.end() > u.off {
			got, ok = x, true
		}
		return false
	})
	if !ok {
		fs.byOff.AscendGreaterOrEqual(extent{off: u.off}, func(x extent) bool {
			if x.off < u.end() {
				got, ok = x, true
			}
			return false
		})
	}
	if !ok {
		return extent{}, false
	}
	lo, hi := max(got.off, u.off), min(got.end(), u.end())
	return extent{off: lo, n: hi - lo}, true
}

// fiemapUnwritten lists the unwritten extents of the open file fd within
// its first size bytes, block-aligned inward, sorted and merged (at most
// maxFiemapExtents are read). ErrPrewriteUnsupported where the file system
// does not answer FIEMAP.
func fiemapUnwritten(fd int, size int64) ([]extent, error) {
	const extentBytes, flagLast, flagUnwritten, fsIOCFiemap = 56, 0x1, 0x800, 0xC020660B
	type fiemap struct {
		Start, Length                               uint64
		Flags, MappedExtents, ExtentCount, Reserved uint32
		Extents                                     [fiemapBatch * extentBytes]byte
	}
	var out []extent
	var fm fiemap
	start, seen := uint64(0), 0
	for seen < maxFiemapExtents && int64(start) < size {
		fm = fiemap{Start: start, Length: uint64(size) - start, ExtentCount: fiemapBatch}
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIOCFiemap, uintptr(unsafe.Pointer(&fm))); e != 0 {
			if errors.Is(e, unix.EOPNOTSUPP) || errors.Is(e, unix.ENOTTY) {
				return nil, ErrPrewriteUnsupported
			}
			return nil, fmt.Errorf("FIEMAP: %w", e)
		}
		if fm.MappedExtents == 0 {
			break
		}
		last := false
		for i := 0; i < int(fm.MappedExtents); i++ {
			b := fm.Extents[i*extentBytes:]
			logical := *(*uint64)(unsafe.Pointer(&b[0]))
			length := *(*uint64)(unsafe.Pointer(&b[16]))
			flags := *(*uint32)(unsafe.Pointer(&b[40]))
			start = logical + length
			last = last || flags&flagLast != 0
			if flags&flagUnwritten == 0 {
				continue
			}
			lo := (int64(logical) + BlockBytes - 1) &^ (BlockBytes - 1)
			hi := min(int64(logical+length), size) &^ (BlockBytes - 1)
			if hi <= lo {
				continue
			}
			if n := len(out); n > 0 && out[n-1].end() == lo {
				out[n-1].n += hi - lo
			} else {
				out = append(out, extent{off: lo, n: hi - lo})
			}
		}
		seen += int(fm.MappedExtents)
		if last {
			break
		}
	}
	return out, nil
}
