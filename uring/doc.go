// Package uring is tutti's I/O engine: io_uring on raw system calls
// (golang.org/x/sys/unix) and off-heap buffers. The seeded simulation of the
// same interface, with fault injection, is beside it in uring/uringsim (not
// in the product); it drives Completions through the engine kit below.
//
// # API
//
//	Buffer   AllocBuffer(n) / Bytes / Addr / Len / Free    off-heap (mmap) memory for I/O
//	Iovecs   NewIovecs(n) / Append / Reset / Free           off-heap iovec array for READV/WRITEV
//	File     OpenFile(path, flags, perm) / NewFile / Close  fd + O_DIRECT alignment (statx DIOALIGN)
//	Completion  Prep{Nop,Read,Write,ReadFixed,WriteFixed,Readv,Writev,Fsync,Fdatasync}
//	Engine   Submit / Flush(waitNr) / InFlight / RegisterFiles / RegisterBuffers / Close
//	Ring     New(Config) — io_uring; Layout, WakeIfNeeded, SQPollCPUTime, SQPollTID, Stats
//	kit      Completion.Validate / Perform / Apply / Abort / OpError / Remaining, Deliver: for engines outside the package
//	Pread/Pwrite  plain pread(2)/pwrite(2) on off-heap memory (the baseline engine)
//	errors   ErrNotSupported, ErrMisaligned (*AlignmentError), ErrClosed, ErrCrashed, ErrInvalid
//
// # Ownership and the flush loop
//
// Completions belong to the caller (arrays or pools; one per I/O in flight).
// Submit validates (O_DIRECT alignment of buffer, offset and length; fixed
// buffer registration; opcode support) and queues; nothing is allocated and
// no channel is used per I/O. Flush moves queued completions into free SQEs
// (bounded by the SQ size and Config.MaxInFlight, which never exceeds the CQ
// size, so the CQ cannot overflow), enters the kernel once per pass, reaps
// every available CQE in one batch, and runs the callbacks of the batch last,
// on the calling goroutine. Short reads/writes are resubmitted for the rest
// (Result is the total; a read ending at EOF completes with fewer bytes and
// no error); EINTR/EAGAIN results are resubmitted up to 16 times; EINTR,
// EAGAIN and EBUSY from io_uring_enter are retried (at most 1000 in a row);
// every other errno is delivered on its own completion, wrapped with the op,
// path, offset and length. Stats counts continuations, retries, overflow use
// and wake-ups.
//
// Buffers, Iovecs and Files must outlive the I/O that uses them; Close of a
// ring with I/O in flight is refused (drain with Flush first).
//
// # Kernel features (each checked by the test named, on Linux 6.18)
//
//   - SQPOLL (+SQ_AFF, sq_thread_idle), SINGLE_ISSUER, DEFER_TASKRUN,
//     COOP_TASKRUN+TASKRUN_FLAG and NO_MMAP are all accepted. A flag the kernel
//     refuses is reported by New as an error wrapping ErrNotSupported naming
//     it (each flag is probed once, alone, to tell which).
//   - SINGLE_ISSUER/DEFER_TASKRUN bind the ring to an OS thread: the owning
//     goroutine must runtime.LockOSThread before New.
//   - NO_MMAP: rings and SQEs are one anonymous MAP_SHARED mapping (rings at
//     offset 0, SQEs at the next page boundary). Linux 6.18 accepts ordinary
//     4 KiB pages for multi-page rings (TestNoMmapLargeRing: 1024 entries,
//     104 KiB). Kernels 6.5–6.12 require each multi-page region to be one
//     folio; New therefore tries a 2 MiB MAP_HUGETLB mapping first (used when
//     vm.nr_hugepages > 0; with none reserved, plain pages are used) and
//     reports EINVAL from such kernels with that explanation. Ubuntu 24.04's
//     6.8 is one of them: reserve huge pages (vm.nr_hugepages) or keep the
//     ring ≤ 1 page.
//   - getrusage(RUSAGE_SELF) includes the iou-sqp thread's CPU time on 6.18
//     (TestSQPollCPUTimeInRusage), so CPU accounting must not add
//     SQPollCPUTime to it again.
//
// # GPU producer
//
// Ring.Layout exposes the ring for a second producer: the SQ index array is
// pre-filled with the identity, so a producer writes the SQE at
// SQEs+(tail&mask)*64 and publishes the tail (release); with SQPOLL it then
// checks SQFlags for NeedWakeupFlag and, if set, asks the CPU to call
// WakeIfNeeded (io_uring_enter with SQ_WAKEUP). A ring shared with a GPU
// producer must not be driven by Submit/Flush at the same time.
//
// SQE layout (64 bytes, little endian): opcode u8 @0, flags u8 @1 (1 =
// IOSQE_FIXED_FILE), ioprio u16 @2, fd i32 @4 (registered index with
// FIXED_FILE), off u64 @8, addr u64 @16, len u32 @24, rw/fsync flags u32
// @28, user_data u64 @32, buf_index u16 @40, zero elsewhere. Opcodes: READV
// 1, WRITEV 2, FSYNC 3, READ_FIXED 4, WRITE_FIXED 5, READ 22, WRITE 23. CQE
// (16 bytes): user_data u64 @0, res i32 @8 (bytes or -errno), flags u32 @12.
package uring
