package faultfs

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestInjectorDecide(t *testing.T) {
	type req struct {
		op     Op
		off, n int64
		fail   bool
	}
	cases := []struct {
		name string
		rule Rule
		reqs []req
	}{
		{"read range", Rule{Op: Read, Off: 4096, Len: 4096}, []req{
			{Read, 0, 4096, false}, {Read, 8192, 4096, false}, {Read, 4096, 512, true},
			{Read, 0, 8192, true}, {Read, 8191, 1, true}, {Write, 4096, 4096, false}, {Fsync, 0, 0, false},
		}},
		{"any write", Rule{Op: Write}, []req{{Write, 1 << 30, 1, true}, {Read, 0, 4096, false}, {Write, 0, 1, true}}},
		{"skip and times", Rule{Op: Fsync, Skip: 2, Times: 2}, []req{
			{Fsync, 0, 0, false}, {Fsync, 0, 0, false}, {Fsync, 0, 0, true}, {Fsync, 0, 0, true}, {Fsync, 0, 0, false},
		}},
		{"skip counts only matches", Rule{Op: Write, Off: 0, Len: 4096, Skip: 1}, []req{
			{Write, 4096, 4096, false}, {Write, 0, 4096, false}, {Write, 8192, 1, false}, {Write, 0, 1, true},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var in Injector
			f, err := in.Arm(tc.rule)
			if err != nil {
				t.Fatal(err)
			}
			want := int64(0)
			for i, r := range tc.reqs {
				if got, stall := in.decide(r.op, r.off, r.n); got != r.fail || stall != nil {
					t.Fatalf("request %d %v [%d,+%d): fail=%v, want %v (rule %v)", i, r.op, r.off, r.n, got, r.fail, tc.rule)
				}
				if r.fail {
					want++
				}
			}
			if f.Hits() != want {
				t.Fatalf("hits %d, want %d", f.Hits(), want)
			}
			in.DisarmAll()
			for _, r := range tc.reqs {
				if fail, _ := in.decide(r.op, r.off, r.n); fail {
					t.Fatalf("disarmed injector failed %v [%d,+%d)", r.op, r.off, r.n)
				}
			}
			if f.Hits() != want || in.Served(tc.reqs[0].op) == 0 {
				t.Fatalf("after disarm: hits %d (want %d), served %d", f.Hits(), want, in.Served(tc.reqs[0].op))
			}
		})
	}
}

func TestInjectorArmRefuses(t *testing.T) {
	var in Injector
	for _, r := range []Rule{{Op: numOps}, {Op: Read, Off: -1}, {Op: Write, Len: -4096}, {Op: Fsync, Times: -1}} {
		if _, err := in.Arm(r); err == nil {
			t.Errorf("Arm(%+v) accepted", r)
		}
	}
	for i := 0; i < maxFaults; i++ {
		if _, err := in.Arm(Rule{Op: Read}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := in.Arm(Rule{Op: Read}); err == nil {
		t.Fatalf("armed %d faults", maxFaults+1)
	}
}

// alignedBuf is n bytes aligned for O_DIRECT.
func alignedBuf(n int) []byte {
	b := make([]byte, n+blockBytes)
	off := int(uintptr(unsafe.Pointer(&b[0])) & (blockBytes - 1))
	if off != 0 {
		off = blockBytes - off
	}
	return b[off : off+n]
}

// TestDevice drives the whole stack with a file opened with O_DIRECT on
// the ext4 over the loop device over the FUSE file: each armed fault
// reaches the system call as EIO and is counted, nothing else fails, and
// the bytes read back after the faults are the bytes written.
func TestDevice(t *testing.T) {
	d := Setup(t, Options{SizeBytes: 32 << 20})
	path := filepath.Join(d.Dir, "f")
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_DIRECT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if fd >= 0 {
			unix.Close(fd)
		}
	}()
	const size = 256 << 10
	if err := unix.Fallocate(fd, 0, 0, size); err != nil {
		t.Fatal(err)
	}
	want := alignedBuf(size)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	if _, err := unix.Pwrite(fd, want, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fdatasync(fd); err != nil {
		t.Fatal(err)
	}
	ext, err := d.Extents(path, 64<<10, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if len(ext) != 1 || ext[0].Length != 4096 || ext[0].Logical != 64<<10 || ext[0].Physical%4096 != 0 {
		t.Fatalf("extents of one block: %+v", ext)
	}
	got := alignedBuf(size)
	steps := []struct {
		name string
		rule Rule
		do   func() error
	}{
		{"read", Rule{Op: Read, Off: ext[0].Physical, Len: 4096}, func() error {
			if _, err := unix.Pread(fd, got[:4096], 0); err != nil {
				return errors.New("a read beside the fault failed: " + err.Error())
			}
			_, err := unix.Pread(fd, got[:4096], 64<<10)
			return err
		}},
		{"write", Rule{Op: Write, Off: ext[0].Physical, Len: 4096}, func() error {
			_, err := unix.Pwrite(fd, want[64<<10:68<<10], 64<<10)
			return err
		}},
		{"fsync", Rule{Op: Fsync, Times: 1}, func() error { return unix.Fdatasync(fd) }},
	}
	for _, st := range steps {
		f, err := d.Inj.Arm(st.rule)
		if err != nil {
			t.Fatal(err)
		}
		err = st.do()
		d.Inj.DisarmAll()
		if !errors.Is(err, unix.EIO) {
			t.Fatalf("%s with %v armed: %v, want EIO", st.name, st.rule, err)
		}
		if f.Hits() == 0 {
			t.Fatalf("%s: the fault never fired", st.name)
		}
	}
	if err := unix.Fdatasync(fd); err != nil {
		t.Fatalf("fdatasync after the faults: %v", err)
	}
	if _, err := unix.Pread(fd, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("bytes read back differ from those written")
	}
	// What was written is on the device itself, past a remount.
	unix.Close(fd)
	fd = -1
	if err := d.Remount(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(b, want) {
		t.Fatalf("after remount: %v, equal %v", err, bytes.Equal(b, want))
	}
}

func TestInjectorStall(t *testing.T) {
	var in Injector
	f, err := in.Arm(Rule{Op: Read, Stall: true, Times: 1})
	if err != nil {
		t.Fatal(err)
	}
	fail, stall := in.decide(Read, 0, 4096)
	if !fail || stall == nil || f.Hits() != 1 {
		t.Fatalf("stalling rule: fail %v, stall %v, hits %d", fail, stall != nil, f.Hits())
	}
	select {
	case <-stall:
		t.Fatal("stall released while armed")
	default:
	}
	in.DisarmAll()
	select {
	case <-stall:
	case <-time.After(10 * time.Second):
		t.Fatal("DisarmAll did not release the stall")
	}
}

// TestDeviceAbort: a request the device never answers (a stalled read) is
// ended by aborting the FUSE connection, which is what the watchdog does:
// the read returns an error instead of hanging, and tear-down still goes.
func TestDeviceAbort(t *testing.T) {
	d := Setup(t, Options{SizeBytes: 16 << 20})
	path := filepath.Join(d.Dir, "f")
	buf := alignedBuf(4096)
	if err := os.WriteFile(path, buf, 0o600); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	ext, err := d.Extents(path, 0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	f, err := d.Inj.Arm(Rule{Op: Read, Off: ext[0].Physical, Len: 4096, Stall: true})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := unix.Pread(fd, buf, 0)
		done <- err
	}()
	for deadline := time.Now().Add(20 * time.Second); f.Hits() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the read never reached the device")
		}
	}
	select {
	case err := <-done:
		t.Fatalf("a stalled read returned (%v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := d.fuse.Abort(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the read over an aborted connection succeeded")
		}
		t.Logf("read after abort: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("abort did not end the stalled read")
	}
}
