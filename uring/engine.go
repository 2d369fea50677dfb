package uring

// Engine is what the packages above program against; *Ring (io_uring) and
// *uringsim.Sim (seeded simulation, in uring/uringsim) implement it.
//
// An Engine is single-goroutine: one goroutine owns it and makes every call,
// TigerBeetle style. Callbacks run on that goroutine inside Flush and may call
// Submit.
type Engine interface {
	// Submit queues a prepared Completion; it never blocks. Request errors
	// (an *AlignmentError wrapping ErrMisaligned naming "buffer", "offset" or
	// "length"; ErrInvalid; ErrNotSupported for an opcode the kernel lacks;
	// ErrClosed, ErrCrashed) are returned here and nothing is queued, so the
	// Callback will not run. On nil the engine owns c until its Callback.
	Submit(c *Completion) error
	// Flush submits queued work (refilling the submission queue from the
	// overflow queue), reaps completions in batches, and runs the callbacks of
	// everything reaped last. waitNr > 0 blocks until at least that many
	// completions were delivered (clamped to InFlight() at entry, so it never
	// waits for work that does not exist). An error is about the engine
	// itself (e.g. the ring fd); per-I/O errors arrive on their Completions.
	Flush(waitNr int) error
	// InFlight counts completions submitted and not yet delivered, including
	// those waiting in the overflow queue.
	InFlight() int
	// RegisterFiles registers files and sets their Index (replacing any
	// earlier registration of this engine; nil unregisters and resets the
	// Index of the files it had). A File registered with one ring is used
	// through its plain fd on any other. Only with nothing in flight.
	RegisterFiles(files []*File) error
	// RegisterBuffers registers buffers; buffer i gets index i. Only with
	// nothing in flight.
	RegisterBuffers(bufs []*Buffer) error
	// Close releases the engine. It fails (wrapping ErrInvalid) while I/O is
	// in flight: drain with Flush first, because the kernel may still write
	// into the caller's buffers.
	Close() error
}

// Stats counts what the engine did beyond plain submission, so that no
// fallback or retry goes unreported.
type Stats struct {
	Submitted     uint64 // SQEs handed to the kernel (continuations and retries included)
	Completed     uint64 // completions delivered to callbacks
	Continuations uint64 // short reads/writes resubmitted for the rest
	Retries       uint64 // EINTR/EAGAIN resubmissions of a single I/O
	EnterRetries  uint64 // io_uring_enter calls retried after EINTR/EAGAIN/EBUSY
	Overflowed    uint64 // completions that waited in the overflow queue because the SQ or MaxInFlight was full
	Wakeups       uint64 // SQPOLL thread wake-ups (io_uring_enter with SQ_WAKEUP)
	Enters        uint64 // io_uring_enter system calls
}

// maxIORetries bounds EINTR/EAGAIN resubmissions of one I/O; maxEnterRetries
// bounds consecutive failing io_uring_enter calls within one Flush.
// maxSQStalls bounds the polls for SQ space that the kernel has consumed
// but not yet released (SQPOLL).
const (
	maxIORetries    = 16
	maxEnterRetries = 1000
	maxSQStalls     = 10_000_000
)
