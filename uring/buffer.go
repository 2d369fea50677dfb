package uring

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Buffer is off-heap memory from an anonymous private mmap: page-aligned,
// zero-filled, never moved by the GC, so its address may be handed to the
// kernel (I/O, registered buffers) or registered with CUDA.
//
// The owner calls Free exactly once, after every I/O using it completed (and
// after unregistering it from any ring or GPU). Bytes() is a view valid until
// Free; a Buffer is not safe for concurrent Free.
type Buffer struct {
	mem  []byte
	raw  []byte // the whole mapping (mem lies inside it); nil for a view
	view bool   // a View of another Buffer: never unmapped through this one
	huge bool   // backed by transparent huge pages (see AllocBuffer)
}

// hugeBytes is the x86-64/arm64 PMD size: transparent huge pages come in it.
const hugeBytes = 2 << 20

// AllocBuffer maps sizeBytes (rounded up to the page size) of anonymous memory.
// Len reports sizeBytes, not the rounded size.
//
// A buffer of at least 2 MiB is aligned to 2 MiB and asked for transparent
// huge pages (madvise MADV_HUGEPAGE; the kernel may refuse, Huge says whether
// it took them) and faulted in at once. Why: a 1 MiB O_DIRECT read into 4 KiB
// pages carries 256 page segments through the block layer, more than many
// devices take in one request (a loop device's max_segments is 128), so the
// kernel splits it, which a nonblocking io_uring issue cannot do, and the read
// is handed to an io-wq worker thread. Registered as a fixed buffer, huge
// pages are one segment per 2 MiB: no split, no worker, less CPU per byte.
func AllocBuffer(sizeBytes int) (*Buffer, error) {
	if sizeBytes <= 0 {
		return nil, fmt.Errorf("uring: allocating buffer of %d bytes: size must be positive", sizeBytes)
	}
	page := unix.Getpagesize()
	mapped := (sizeBytes + page - 1) / page * page
	if sizeBytes < hugeBytes {
		mem, err := unix.Mmap(-1, 0, mapped, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return nil, fmt.Errorf("uring: allocating buffer of %d bytes: mmap: %w", sizeBytes, err)
		}
		return &Buffer{mem: mem[:sizeBytes:mapped], raw: mem}, nil
	}
	mapped = (sizeBytes + hugeBytes - 1) / hugeBytes * hugeBytes
	raw, err := unix.Mmap(-1, 0, mapped+hugeBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("uring: allocating buffer of %d bytes: mmap: %w", sizeBytes, err)
	}
	skip := int((hugeBytes - uintptr(unsafe.Pointer(&raw[0]))%hugeBytes) % hugeBytes)
	mem := raw[skip : skip+mapped : skip+mapped]
	b := &Buffer{mem: mem[:sizeBytes:mapped], raw: raw}
	// Advice only: without THP (disabled, or no huge page free) the buffer is
	// the same memory in 4 KiB pages; Huge reports which.
	if unix.Madvise(mem, unix.MADV_HUGEPAGE) == nil {
		for i := 0; i < len(mem); i += page {
			mem[i] = 0 // fault in now, as huge pages while the advice holds
		}
		b.huge = hugeBacked(uintptr(unsafe.Pointer(&mem[0])), len(mem))
	}
	return b, nil
}

// Huge reports whether the buffer's memory is backed by transparent huge
// pages (read from /proc/self/smaps at allocation; false for a view).
func (b *Buffer) Huge() bool { return b.huge }

// HugeNow reads /proc/self/smaps again: whether the buffer is still wholly
// backed by huge pages (pinning by another driver, e.g. CUDA's host
// registration, may split or migrate them after allocation).
func (b *Buffer) HugeNow() bool {
	if b.mem == nil || !b.huge {
		return false
	}
	return hugeBacked(b.Addr(), (len(b.mem)+hugeBytes-1)/hugeBytes*hugeBytes)
}

// Bytes is a view of the buffer; it must not be used after Free.
func (b *Buffer) Bytes() []byte { return b.mem }

// Addr is the address of the first byte (page-aligned).
func (b *Buffer) Addr() uintptr {
	if len(b.mem) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(&b.mem[0]))
}

// Len is the usable size in bytes.
func (b *Buffer) Len() int { return len(b.mem) }

// View returns lenBytes of b from offBytes as a Buffer that does not own its
// memory (for registering parts of one mapping as separate fixed buffers).
// It is valid until b is freed; Free on a view is an error.
func (b *Buffer) View(offBytes, lenBytes int) (*Buffer, error) {
	if b.mem == nil {
		return nil, fmt.Errorf("uring: view of a freed buffer: %w", ErrClosed)
	}
	if offBytes < 0 || lenBytes <= 0 || offBytes > len(b.mem)-lenBytes {
		return nil, fmt.Errorf("uring: view [%d,+%d) of a %d-byte buffer: %w", offBytes, lenBytes, len(b.mem), ErrInvalid)
	}
	return &Buffer{mem: b.mem[offBytes : offBytes+lenBytes : offBytes+lenBytes], view: true}, nil
}

// Free unmaps the buffer. A second Free returns ErrClosed.
func (b *Buffer) Free() error {
	if b.mem == nil {
		return fmt.Errorf("uring: freeing buffer: %w", ErrClosed)
	}
	if b.view {
		return fmt.Errorf("uring: freeing a view: free the buffer it views: %w", ErrInvalid)
	}
	err := unix.Munmap(b.raw)
	b.mem, b.raw = nil, nil
	if err != nil {
		return fmt.Errorf("uring: freeing buffer: munmap: %w", err)
	}
	return nil
}

// Iovecs is an off-heap array of struct iovec for READV/WRITEV, so that the
// kernel reads the vector from memory the GC never moves. The owner calls
// Free once. While a vectored op is in flight the engine may rewrite entries
// (to continue a short transfer); it restores them before the callback.
type Iovecs struct {
	buf *Buffer
	vec []iovec
	n   int
}

// maxIovecs is the kernel's UIO_MAXIOV.
const maxIovecs = 1024

// NewIovecs allocates room for capacity entries (at most 1024, UIO_MAXIOV).
func NewIovecs(capacity int) (*Iovecs, error) {
	if capacity <= 0 || capacity > maxIovecs {
		return nil, fmt.Errorf("uring: allocating %d iovecs: capacity must be in 1..%d", capacity, maxIovecs)
	}
	b, err := AllocBuffer(capacity * int(unsafe.Sizeof(iovec{})))
	if err != nil {
		return nil, err
	}
	vec := unsafe.Slice((*iovec)(unsafe.Pointer(&b.mem[0])), capacity)
	return &Iovecs{buf: b, vec: vec}, nil
}

// Append adds one entry; it fails when the capacity is reached.
func (v *Iovecs) Append(addr uintptr, lenBytes int) error {
	if v.n == len(v.vec) {
		return fmt.Errorf("uring: appending iovec: capacity %d reached", len(v.vec))
	}
	v.vec[v.n] = iovec{Base: uint64(addr), Len: uint64(lenBytes)}
	v.n++
	return nil
}

// Reset drops all entries.
func (v *Iovecs) Reset() { v.n = 0 }

// Len is the number of entries.
func (v *Iovecs) Len() int { return v.n }

// At returns entry i.
func (v *Iovecs) At(i int) (addr uintptr, lenBytes int) {
	return uintptr(v.vec[i].Base), int(v.vec[i].Len)
}

// TotalBytes is the sum of the entries' lengths.
func (v *Iovecs) TotalBytes() int64 {
	var t int64
	for i := 0; i < v.n; i++ {
		t += int64(v.vec[i].Len)
	}
	return t
}

// addr of entry i.
func (v *Iovecs) entryAddr(i int) uintptr {
	return v.buf.Addr() + uintptr(i)*unsafe.Sizeof(iovec{})
}

// Free releases the off-heap array.
func (v *Iovecs) Free() error {
	v.vec = nil
	v.n = 0
	return v.buf.Free()
}
