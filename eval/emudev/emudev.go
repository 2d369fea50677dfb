// Package emudev is emulated storage that holds still: RAM-backed files
// served through FUSE (internal/fusefile), each paced as one device of a
// fixed read and write rate, for loop devices with direct I/O to stand in
// for an NVMe array on a machine that has none. The kernel's own limiters
// hold some I/O patterns and not others on the GPU machine (BENCHMARKS.md,
// Emulated storage): blk-throttle admits a slice of its rate at once after
// an idle spell, iocost starves some patterns and lets others through. A
// pacer here serves every request first come first served at the rate, so
// the rate a transfer meets does not depend on its size, its depth or what
// came before it.
//
// The bytes live in the backing files (tmpfs, fully written: scripts/
// emuloop.sh), mapped into this process; the FUSE file a loop device sits on
// moves them with one copy each way. Sync is a no-op: the device is RAM.
package emudev

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tutti-io/tutti/internal/fusefile"
	"golang.org/x/sys/unix"
)

// Limits.
const (
	MaxDevices      = 64
	MaxDeviceBytes  = 1 << 40
	MinBytesPerSec  = 1 << 20 // below, a 1 MiB request would wait a second
	unmountTimeout  = 30 * time.Second
	sleepFloorNanos = 20_000 // a wait shorter than this is not slept
	maxInFlight     = 256    // asynchronous requests a device keeps in flight (a loop device's queue: 128)
)

// Config says what to emulate.
type Config struct {
	// Backing are the devices' backing files, one per device, each a
	// positive multiple of 4096 bytes and at most MaxDeviceBytes.
	Backing []string
	// MountDir holds the mounts: device i's file is MountDir/i/disk.
	MountDir string
	// ReadBytesPerSec and WriteBytesPerSec are every device's rates
	// (0: that direction unpaced; otherwise at least MinBytesPerSec).
	ReadBytesPerSec, WriteBytesPerSec int64
}

// DeviceStats are one device's counters since Start.
type DeviceStats struct {
	Path         string `json:"path"`
	ReadBytes    int64  `json:"read_bytes"`
	WriteBytes   int64  `json:"write_bytes"`
	Reads        int64  `json:"reads"`
	Writes       int64  `json:"writes"`
	Syncs        int64  `json:"syncs"`
	PacedWaitNs  int64  `json:"paced_wait_ns"` // time requests spent waiting for their turn
	Interrupted  int64  `json:"interrupted"`   // requests the kernel gave up while they waited
	OutOfRangeRW int64  `json:"out_of_range"`  // requests refused past the mapping (never expected)
}

// Emulator is a running set of emulated devices.
type Emulator struct {
	devs    []*device
	servers []*fusefile.Server
}

type device struct {
	path        string
	mem         []byte // the backing file, mapped shared
	read, write pacer
	start       time.Time
	st          DeviceStats
}

// Start maps every backing file and mounts its FUSE file. On error nothing
// stays mounted or mapped. The caller must Close.
func Start(cfg Config) (*Emulator, error) {
	if n := len(cfg.Backing); n < 1 || n > MaxDevices {
		return nil, fmt.Errorf("emudev: %d backing files, want 1..%d", n, MaxDevices)
	}
	for _, r := range []struct {
		name string
		v    int64
	}{{"read", cfg.ReadBytesPerSec}, {"write", cfg.WriteBytesPerSec}} {
		if r.v != 0 && r.v < MinBytesPerSec {
			return nil, fmt.Errorf("emudev: %s rate %d B/s, want 0 (unpaced) or at least %d", r.name, r.v, MinBytesPerSec)
		}
	}
	if cfg.MountDir == "" {
		return nil, errors.New("emudev: no mount directory")
	}
	e := &Emulator{}
	for i, b := range cfg.Backing {
		d, err := mapDevice(b)
		if err == nil {
			d.read.bytesPerSec, d.write.bytesPerSec = cfg.ReadBytesPerSec, cfg.WriteBytesPerSec
			dir := filepath.Join(cfg.MountDir, strconv.Itoa(i))
			var s *fusefile.Server
			if _, serr := os.Stat(dir); errors.Is(serr, syscall.ENOTCONN) {
				// a mount an emulator left when it was killed: nothing answers it
				_ = unix.Unmount(dir, unix.MNT_DETACH)
			}
			if err = os.MkdirAll(dir, 0o755); err == nil {
				s, err = fusefile.Mount(dir, "tutti-emudev", int64(len(d.mem)), d, fusefile.Options{AsyncDIO: true, MaxBackground: maxInFlight})
			}
			if err == nil {
				d.path = s.Path()
				e.devs, e.servers = append(e.devs, d), append(e.servers, s)
				continue
			}
			_ = unix.Munmap(d.mem)
		}
		return nil, errors.Join(fmt.Errorf("emudev: device %d (%s): %w", i, b, err), e.Close())
	}
	return e, nil
}

func mapDevice(path string) (*device, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if sz := fi.Size(); sz <= 0 || sz%4096 != 0 || sz > MaxDeviceBytes {
		return nil, fmt.Errorf("size %d bytes, want a positive multiple of 4096 up to %d", sz, int64(MaxDeviceBytes))
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap: %w", err)
	}
	return &device{mem: mem, start: time.Now()}, nil
}

// Paths are the served files, one per backing file, in Config's order: what
// a loop device goes over (losetup --direct-io=on).
func (e *Emulator) Paths() []string {
	p := make([]string, len(e.devs))
	for i, d := range e.devs {
		p[i] = d.path
	}
	return p
}

// Stats returns every device's counters.
func (e *Emulator) Stats() []DeviceStats {
	out := make([]DeviceStats, len(e.devs))
	for i, d := range e.devs {
		out[i] = DeviceStats{Path: d.path, ReadBytes: atomic.LoadInt64(&d.st.ReadBytes), WriteBytes: atomic.LoadInt64(&d.st.WriteBytes),
			Reads: atomic.LoadInt64(&d.st.Reads), Writes: atomic.LoadInt64(&d.st.Writes), Syncs: atomic.LoadInt64(&d.st.Syncs),
			PacedWaitNs: atomic.LoadInt64(&d.st.PacedWaitNs), Interrupted: atomic.LoadInt64(&d.st.Interrupted),
			OutOfRangeRW: atomic.LoadInt64(&d.st.OutOfRangeRW)}
	}
	return out
}

// Close unmounts every device (lazily where busy: detach the loop devices
// first) and unmaps the backing files; their contents stay in the files.
func (e *Emulator) Close() error {
	var errs []error
	for i, s := range e.servers {
		if err := s.Unmount(unmountTimeout); err != nil {
			errs = append(errs, err)
		}
		if err := unix.Munmap(e.devs[i].mem); err != nil {
			errs = append(errs, fmt.Errorf("emudev: munmap %s: %w", e.devs[i].path, err))
		}
	}
	e.servers, e.devs = nil, nil
	return errors.Join(errs...)
}

// wait holds a request until its pacer says it is done.
func (d *device) wait(ctx context.Context, p *pacer, n int64) syscall.Errno {
	now := time.Since(d.start).Nanoseconds()
	due := p.reserve(now, n)
	w := due - now
	if w < sleepFloorNanos {
		return 0
	}
	atomic.AddInt64(&d.st.PacedWaitNs, w)
	t := time.NewTimer(time.Duration(w))
	defer t.Stop()
	select {
	case <-t.C:
		return 0
	case <-ctx.Done():
		atomic.AddInt64(&d.st.Interrupted, 1)
		return syscall.EINTR
	}
}

func (d *device) inRange(n int, off int64) bool {
	if off < 0 || off+int64(n) > int64(len(d.mem)) {
		atomic.AddInt64(&d.st.OutOfRangeRW, 1)
		return false
	}
	return true
}

// ReadAt copies the bytes out, then holds the reply until the device would
// have read them.
func (d *device) ReadAt(ctx context.Context, p []byte, off int64) syscall.Errno {
	if !d.inRange(len(p), off) {
		return syscall.EIO
	}
	copy(p, d.mem[off:])
	atomic.AddInt64(&d.st.Reads, 1)
	atomic.AddInt64(&d.st.ReadBytes, int64(len(p)))
	return d.wait(ctx, &d.read, int64(len(p)))
}

// WriteAt stores the bytes, then holds the reply until the device would
// have written them.
func (d *device) WriteAt(ctx context.Context, p []byte, off int64) syscall.Errno {
	if !d.inRange(len(p), off) {
		return syscall.ENOSPC
	}
	copy(d.mem[off:], p)
	atomic.AddInt64(&d.st.Writes, 1)
	atomic.AddInt64(&d.st.WriteBytes, int64(len(p)))
	return d.wait(ctx, &d.write, int64(len(p)))
}

// Sync has nothing to do: the device is RAM.
func (d *device) Sync(ctx context.Context) syscall.Errno {
	atomic.AddInt64(&d.st.Syncs, 1)
	return 0
}
