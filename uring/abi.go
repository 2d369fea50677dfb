package uring

// Kernel ABI of io_uring (include/uapi/linux/io_uring.h). Defined here rather
// than taken from a library so that every byte the kernel (or a GPU producer)
// reads is under our control; sizes are checked in abi_test.go.

// Setup flags (io_uring_params.flags).
const (
	setupIOPoll        = 1 << 0
	setupSQPoll        = 1 << 1
	setupSQAff         = 1 << 2
	setupCQSize        = 1 << 3
	setupClamp         = 1 << 4
	setupRDisabled     = 1 << 6
	setupSubmitAll     = 1 << 7
	setupCoopTaskrun   = 1 << 8
	setupTaskrunFlag   = 1 << 9
	setupSingleIssuer  = 1 << 12
	setupDeferTaskrun  = 1 << 13
	setupNoMmap        = 1 << 14
	setupNoSQArray     = 1 << 16
	setupRegisteredFD  = 1 << 15
	featSingleMmap     = 1 << 0
	featNoDrop         = 1 << 1
	featSubmitStable   = 1 << 2
	featNativeWorkers  = 1 << 9
	featSQPollNonfixed = 1 << 7
)

// io_uring_enter flags.
const (
	enterGetEvents = 1 << 0
	enterSQWakeup  = 1 << 1
)

// SQ ring flags (written by the kernel into the ring's flags word).
const (
	sqNeedWakeup = 1 << 0
	sqCQOverflow = 1 << 1
	sqTaskrun    = 1 << 2
)

// mmap offsets of the three regions of an mmap'd ring.
const (
	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000
)

// Opcodes (enum io_uring_op).
const (
	opNop        = 0
	opReadv      = 1
	opWritev     = 2
	opFsync      = 3
	opReadFixed  = 4
	opWriteFixed = 5
	opRead       = 22
	opWrite      = 23
)

// SQE flags and fsync flags.
const (
	sqeFixedFile  = 1 << 0
	fsyncDatasync = 1 << 0
)

// io_uring_register opcodes.
const (
	registerBuffers   = 0
	unregisterBuffers = 1
	registerFiles     = 2
	unregisterFiles   = 3
	registerProbe     = 8
	registerEnable    = 12 // IORING_REGISTER_ENABLE_RINGS

	probeOpSupported = 1 << 0
)

type sqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Flags, Dropped, Array, Resv1 uint32
	UserAddr                                                        uint64
}

type cqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Overflow, Cqes, Flags, Resv1 uint32
	UserAddr                                                        uint64
}

// params is struct io_uring_params (120 bytes).
type params struct {
	SQEntries    uint32
	CQEntries    uint32
	Flags        uint32
	SQThreadCPU  uint32
	SQThreadIdle uint32
	Features     uint32
	WQFD         uint32
	Resv         [3]uint32
	SQOff        sqringOffsets
	CQOff        cqringOffsets
}

// sqe is struct io_uring_sqe (64 bytes) with the unions reduced to the
// fields the supported opcodes use.
type sqe struct {
	Opcode      uint8
	Flags       uint8
	Ioprio      uint16
	FD          int32
	Off         uint64
	Addr        uint64
	Len         uint32
	OpFlags     uint32 // rw_flags / fsync_flags
	UserData    uint64
	BufIndex    uint16
	Personality uint16
	SpliceFDIn  int32
	Addr3       uint64
	Pad2        uint64
}

// cqe is struct io_uring_cqe (16 bytes; rings are set up without CQE32).
type cqe struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

// probeHeader is struct io_uring_probe without its flexible array of ops.
type probeHeader struct {
	LastOp uint8
	OpsLen uint8
	Resv   uint16
	Resv2  [3]uint32
}

// probeOp is struct io_uring_probe_op.
type probeOp struct {
	Op    uint8
	Resv  uint8
	Flags uint16
	Resv2 uint32
}

// iovec is struct iovec laid out by hand so that addresses stay integers (the
// memory is off-heap; see Iovecs).
type iovec struct {
	Base uint64
	Len  uint64
}

// kernelRSrcMaxOps bounds the probe array (the kernel's IORING_OP_LAST is
// below 64 on 6.x; 256 is the register call's own limit).
const probeOps = 256
