package faultfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Options configure Setup.
type Options struct {
	// SizeBytes is the device's size (default 64 MiB; a multiple of 4096).
	SizeBytes int64
	// Timeout bounds the device's whole life: past it the FUSE connection
	// is aborted and every fault disarmed, so every request fails instead
	// of hanging, and the test fails (default 3 minutes).
	Timeout time.Duration
}

// Limits.
const (
	defaultSizeBytes = 64 << 20
	maxSizeBytes     = 1 << 30
	defaultTimeout   = 3 * time.Minute
	stepTimeout      = time.Minute // mkfs, one unmount
	loopTries        = 8           // LOOP_CTL_GET_FREE races with other users of loop devices
	blockBytes       = 4096
)

// Device is an ext4 file system on a loop device (direct I/O) over the
// FUSE file: every read and write of a file opened with O_DIRECT, every
// writeback of a buffered one and every flush reaches Inj. ext4 is made
// without a journal, so a failed request is returned to the caller that
// waits for it, not to a journal thread.
type Device struct {
	Inj *Injector
	// Dir is where the file system is mounted.
	Dir string
	// Loop is the loop device's path.
	Loop string

	fuse     *Server
	backing  *os.File
	loopFD   int
	mounted  bool
	watchdog *time.Timer
	fired    atomic.Bool
}

// Setup builds a Device for t and tears it down in t's Cleanup (also when
// t fails). It skips t where the machine cannot: not root, no /dev/fuse, no
// /dev/loop-control or no mkfs.ext4; once those exist, any failure to build
// the stack fails t.
func Setup(t testing.TB, o Options) *Device {
	t.Helper()
	if o.SizeBytes == 0 {
		o.SizeBytes = defaultSizeBytes
	}
	if o.SizeBytes < 0 || o.SizeBytes > maxSizeBytes || o.SizeBytes%blockBytes != 0 {
		t.Fatalf("faultfs: SizeBytes %d, want a multiple of %d up to %d", o.SizeBytes, blockBytes, maxSizeBytes)
	}
	if o.Timeout <= 0 {
		o.Timeout = defaultTimeout
	}
	mkfs := skipUnlessAble(t)

	// TempDir first: cleanups run last-in first-out, so the tear-down
	// unmounts before the directory is removed.
	root := t.TempDir()
	d := &Device{Inj: &Injector{}, loopFD: -1}
	t.Cleanup(func() { d.teardown(t) })
	var err error
	d.backing, err = os.OpenFile(filepath.Join(root, "backing.img"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatalf("faultfs: backing file: %v", err)
	}
	if err := d.backing.Truncate(o.SizeBytes); err != nil {
		t.Fatalf("faultfs: sizing the backing file: %v", err)
	}
	// mkfs writes the backing file directly: the injector sees only what
	// the test does on the file system.
	ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, mkfs, "-q", "-F", "-b", "4096", "-m", "0", "-O", "^has_journal",
		"-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard", d.backing.Name())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("faultfs: %s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}

	ensureFusectl()
	mnt := filepath.Join(root, "fuse")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatalf("faultfs: %v", err)
	}
	if d.fuse, err = Mount(mnt, d.backing, o.SizeBytes, d.Inj); err != nil {
		t.Fatal(err)
	}
	d.watchdog = time.AfterFunc(o.Timeout, func() {
		d.fired.Store(true)
		_ = d.fuse.Abort()
		d.Inj.DisarmAll()
	})
	if err := d.attachLoop(); err != nil {
		t.Fatal(err)
	}
	d.Dir = filepath.Join(root, "fs")
	if err := os.Mkdir(d.Dir, 0o700); err != nil {
		t.Fatalf("faultfs: %v", err)
	}
	if err := d.mount(); err != nil {
		t.Fatal(err)
	}
	return d
}

// skipUnlessAble skips t where a Device cannot be built and returns the
// path of mkfs.ext4.
func skipUnlessAble(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("faultfs: needs root (FUSE mount, loop device, ext4 mount); skipped")
	}
	for _, p := range []string{"/dev/fuse", "/dev/loop-control"} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("faultfs: needs %s: %v; skipped", p, err)
		}
	}
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		for _, p := range []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
			if _, serr := os.Stat(p); serr == nil {
				return p
			}
		}
		t.Skipf("faultfs: needs mkfs.ext4 (e2fsprogs): %v; skipped", err)
	}
	return mkfs
}

// ensureFusectl mounts fusectl where it is not, so that Abort works; where
// it cannot be mounted a hung connection is still ended by the lazy
// unmounts of teardown, only not for requests already in flight.
func ensureFusectl() {
	if _, err := os.Stat("/sys/fs/fuse/connections"); err != nil {
		return
	}
	ents, err := os.ReadDir("/sys/fs/fuse/connections")
	if err == nil && len(ents) > 0 {
		return
	}
	_ = unix.Mount("fusectl", "/sys/fs/fuse/connections", "fusectl", 0, "")
}

// attachLoop attaches a free loop device to the FUSE file with direct I/O
// and checks that the driver took it (else it would cache in the page cache
// of the FUSE file).
func (d *Device) attachLoop() error {
	file, err := os.OpenFile(d.fuse.Path(), os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("faultfs: opening %s: %w", d.fuse.Path(), err)
	}
	defer file.Close() // the loop device holds its own reference
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("faultfs: %w", err)
	}
	defer ctl.Close()
	for try := 0; try < loopTries; try++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return fmt.Errorf("faultfs: LOOP_CTL_GET_FREE: %w", err)
		}
		path := fmt.Sprintf("/dev/loop%d", n)
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("faultfs: opening %s: %w", path, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(file.Fd()), Size: blockBytes}
		cfg.Info.Flags = unix.LO_FLAGS_DIRECT_IO
		copy(cfg.Info.File_name[:], "tutti-faultfs")
		if err := unix.IoctlLoopConfigure(fd, &cfg); err != nil {
			unix.Close(fd)
			if errors.Is(err, unix.EBUSY) {
				continue // taken by someone else meanwhile
			}
			return fmt.Errorf("faultfs: LOOP_CONFIGURE %s: %w", path, err)
		}
		d.loopFD, d.Loop = fd, path
		b, err := os.ReadFile(fmt.Sprintf("/sys/block/loop%d/loop/dio", n))
		if err != nil {
			return fmt.Errorf("faultfs: reading %s's direct I/O state: %w", path, err)
		}
		if strings.TrimSpace(string(b)) != "1" {
			return fmt.Errorf("faultfs: %s did not take direct I/O over %s (dio=%s)", path, d.fuse.Path(), strings.TrimSpace(string(b)))
		}
		return nil
	}
	return fmt.Errorf("faultfs: no free loop device after %d tries", loopTries)
}

func (d *Device) mount() error {
	if err := unix.Mount(d.Loop, d.Dir, "ext4", unix.MS_NOATIME, "errors=continue"); err != nil {
		return fmt.Errorf("faultfs: mounting %s on %s: %w", d.Loop, d.Dir, err)
	}
	d.mounted = true
	return nil
}

// unmount unmounts the file system; a busy one is detached lazily and
// reported.
func (d *Device) unmount() error {
	if !d.mounted {
		return nil
	}
	err := unix.Unmount(d.Dir, 0)
	if err == nil {
		d.mounted = false
		return nil
	}
	if lerr := unix.Unmount(d.Dir, unix.MNT_DETACH); lerr != nil {
		return fmt.Errorf("faultfs: unmounting %s: %v; lazily: %v", d.Dir, err, lerr)
	}
	d.mounted = false
	return fmt.Errorf("faultfs: unmounting %s: %v (detached lazily)", d.Dir, err)
}

// Remount unmounts and mounts the file system again: what a reader sees
// afterwards comes from the device, not from the page cache (as after a
// restart). Faults stay armed; nothing may hold a file of Dir open.
func (d *Device) Remount() error {
	if err := d.unmount(); err != nil {
		return err
	}
	return d.mount()
}

// Extents maps [off, off+n) of the file at path to byte ranges of the
// device, which are the FUSE file's offsets the injector's rules name.
func (d *Device) Extents(path string, off, n int64) ([]Extent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("faultfs: %w", err)
	}
	defer f.Close()
	return Extents(int(f.Fd()), off, n)
}

// teardown unmounts ext4, detaches the loop device and unmounts FUSE, each
// bounded; it reports what did not go cleanly and whether the watchdog
// fired.
func (d *Device) teardown(t testing.TB) {
	if d.watchdog != nil {
		d.watchdog.Stop()
	}
	d.Inj.DisarmAll() // stalled requests return
	if d.fired.Load() {
		t.Errorf("faultfs: the device outlived its timeout; the FUSE connection was aborted")
	}
	if err := d.unmount(); err != nil {
		t.Error(err)
	}
	if d.loopFD >= 0 {
		// A device still in use (a lazy unmount) is detached by the kernel
		// once its last user goes: LOOP_CLR_FD sets autoclear then.
		if err := unix.IoctlSetInt(d.loopFD, unix.LOOP_CLR_FD, 0); err != nil {
			t.Errorf("faultfs: detaching %s: %v", d.Loop, err)
		}
		unix.Close(d.loopFD)
	}
	if d.fuse != nil {
		if err := d.fuse.Unmount(stepTimeout); err != nil {
			t.Error(err)
		}
	}
	if d.backing != nil {
		d.backing.Close()
	}
}
