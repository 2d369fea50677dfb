package uring

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Features are probed once per process.
var probe struct {
	once      sync.Once
	err       error
	supported [probeOps]bool
	lastOp    uint8
	flagMu    sync.Mutex
	flagOK    map[uint32]error // setup flag -> nil (works) or the error
}

func probeOpcodes() error {
	probe.once.Do(func() {
		var p params
		fd, err := sysSetup(2, &p)
		if err != nil {
			probe.err = fmt.Errorf("uring: io_uring_setup: %w: %w (io_uring disabled? see /proc/sys/kernel/io_uring_disabled)", ErrNotSupported, err)
			return
		}
		defer unix.Close(fd)
		var buf [unsafe.Sizeof(probeHeader{}) + probeOps*unsafe.Sizeof(probeOp{})]byte
		if _, err := sysRegister(fd, registerProbe, unsafe.Pointer(&buf[0]), probeOps); err != nil {
			probe.err = fmt.Errorf("uring: IORING_REGISTER_PROBE: %w: %w", ErrNotSupported, err)
			return
		}
		h := (*probeHeader)(unsafe.Pointer(&buf[0]))
		ops := unsafe.Slice((*probeOp)(unsafe.Pointer(&buf[unsafe.Sizeof(probeHeader{})])), probeOps)
		probe.lastOp = h.LastOp
		for i := 0; i < int(h.OpsLen) && i < probeOps; i++ {
			if ops[i].Flags&probeOpSupported != 0 {
				probe.supported[ops[i].Op] = true
			}
		}
	})
	return probe.err
}

var opcodeNames = map[uint8]string{
	opNop: "IORING_OP_NOP", opReadv: "IORING_OP_READV", opWritev: "IORING_OP_WRITEV", opFsync: "IORING_OP_FSYNC",
	opReadFixed: "IORING_OP_READ_FIXED", opWriteFixed: "IORING_OP_WRITE_FIXED", opRead: "IORING_OP_READ", opWrite: "IORING_OP_WRITE",
}

func kernelOpcode(o Op) uint8 {
	switch o {
	case OpNop:
		return opNop
	case OpReadv:
		return opReadv
	case OpWritev:
		return opWritev
	case OpFsync, OpFdatasync:
		return opFsync
	default:
		return map4(o)
	}
}

// opSupported reports ErrNotSupported naming the opcode if the kernel's
// probe does not list it.
func opSupported(o Op) error {
	if err := probeOpcodes(); err != nil {
		return err
	}
	k := kernelOpcode(o)
	if !probe.supported[k] {
		return fmt.Errorf("uring: %s: %s: %w", o, opcodeNames[k], ErrNotSupported)
	}
	return nil
}

// OpcodeSupported reports whether the kernel lists op in IORING_REGISTER_PROBE.
func OpcodeSupported(o Op) bool { return opSupported(o) == nil }

var setupFlagNames = []struct {
	flag uint32
	name string
}{
	{setupSQPoll, "IORING_SETUP_SQPOLL"},
	{setupSQAff, "IORING_SETUP_SQ_AFF"},
	{setupCQSize, "IORING_SETUP_CQSIZE"},
	{setupCoopTaskrun, "IORING_SETUP_COOP_TASKRUN"},
	{setupTaskrunFlag, "IORING_SETUP_TASKRUN_FLAG"},
	{setupSingleIssuer, "IORING_SETUP_SINGLE_ISSUER"},
	{setupDeferTaskrun, "IORING_SETUP_DEFER_TASKRUN"},
	{setupNoMmap, "IORING_SETUP_NO_MMAP"},
}

// companions are the flags a flag cannot be set up without.
func companions(f uint32) uint32 {
	switch f {
	case setupSQAff:
		return setupSQPoll
	case setupTaskrunFlag:
		return setupCoopTaskrun
	case setupDeferTaskrun:
		return setupSingleIssuer
	}
	return 0
}

// flagSupported tries a 2-entry ring with flag (and its companions) once.
func flagSupported(flag uint32) error {
	probe.flagMu.Lock()
	defer probe.flagMu.Unlock()
	if probe.flagOK == nil {
		probe.flagOK = map[uint32]error{}
	}
	if err, ok := probe.flagOK[flag]; ok {
		return err
	}
	cfg := Config{Entries: 2, SQThreadCPU: -1}
	switch flag {
	case setupSQPoll:
		cfg.SQPoll = true
	case setupSQAff:
		cfg.SQPoll, cfg.SQThreadCPU = true, 0
	case setupCoopTaskrun, setupTaskrunFlag:
		cfg.CoopTaskrun = true
	case setupSingleIssuer:
		cfg.SingleIssuer = true
	case setupDeferTaskrun:
		cfg.DeferTaskrun = true
	case setupNoMmap:
		cfg.NoMmap = true
	}
	p := params{Flags: flagsOf(cfg) | companions(flag), CQEntries: 4}
	var mem []byte
	if cfg.NoMmap {
		var err error
		mem, err = unix.Mmap(-1, 0, 2*unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
		if err != nil {
			return fmt.Errorf("uring: probing NO_MMAP: %w", err)
		}
		defer unix.Munmap(mem)
		p.CQOff.UserAddr = uint64(uintptr(unsafe.Pointer(&mem[0])))
		p.SQOff.UserAddr = p.CQOff.UserAddr + uint64(unix.Getpagesize())
	}
	fd, err := sysSetup(2, &p)
	if err == nil {
		unix.Close(fd)
	}
	probe.flagOK[flag] = err
	return err
}

// setupError turns a failed io_uring_setup into an error naming the flag the
// kernel refuses (wrapping ErrNotSupported), or the combination.
func setupError(cfg Config, flags uint32, err error) error {
	if perr := probeOpcodes(); perr != nil {
		return perr
	}
	for _, fn := range setupFlagNames {
		if flags&fn.flag == 0 {
			continue
		}
		if ferr := flagSupported(fn.flag); ferr != nil {
			return fmt.Errorf("uring: setting up ring: %s: %w (%w)", fn.name, ErrNotSupported, ferr)
		}
	}
	if cfg.NoMmap && err == unix.EINVAL {
		return fmt.Errorf("uring: setting up NO_MMAP ring (%d entries): %w (the kernel refused the app-provided memory: kernels before the 6.13 region rework want each multi-page region in one huge page, and no MAP_HUGETLB page was available; use fewer entries or reserve hugepages in /proc/sys/vm/nr_hugepages)", cfg.Entries, err)
	}
	return fmt.Errorf("uring: setting up ring (flags %#x, %d entries): %w", flags, cfg.Entries, err)
}

// taskIDs lists this process's thread ids.
func taskIDs() map[int]bool {
	m := map[int]bool{}
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return m
	}
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			m[tid] = true
		}
	}
	return m
}

// newTasks are the thread ids that appeared since before: the ring's
// iou-sqp thread is among them (it names itself only once it runs, so it is
// resolved later by resolveSQPollThread).
func newTasks(before map[int]bool) []int {
	var out []int
	for tid := range taskIDs() {
		if !before[tid] {
			out = append(out, tid)
		}
	}
	return out
}

// resolveSQPollThread picks the one candidate named iou-sqp-*, waiting up to
// 100 ms for the thread to name itself; -1 if none or several.
func resolveSQPollThread(candidates []int) int {
	for wait := 0; wait < 100; wait++ {
		found := -1
		for _, tid := range candidates {
			comm, err := os.ReadFile("/proc/self/task/" + strconv.Itoa(tid) + "/comm")
			if err != nil || !strings.HasPrefix(string(comm), "iou-sqp") {
				continue
			}
			if found >= 0 {
				return -1
			}
			found = tid
		}
		if found >= 0 {
			return found
		}
		time.Sleep(time.Millisecond)
	}
	return -1
}
