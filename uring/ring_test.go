package uring

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// newRingOrSkip creates a ring, skipping (with the feature named) when the
// kernel refuses it; any other error fails.
func newRingOrSkip(t testing.TB, cfg Config) *Ring {
	t.Helper()
	r, err := New(cfg)
	if errors.Is(err, ErrNotSupported) {
		t.Skipf("kernel refuses this ring: %v", err)
	}
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	t.Cleanup(func() {
		if r.InFlight() > 0 {
			_ = r.Flush(r.InFlight())
		}
		_ = r.Close()
	})
	return r
}

// directFile creates a file of sizeBytes random bytes (seeded) and opens it
// with O_DIRECT; it returns the file and its content.
func directFile(t testing.TB, dir string, sizeBytes int, seed uint64) (*File, []byte) {
	t.Helper()
	data := make([]byte, sizeBytes)
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	path := filepath.Join(dir, fmt.Sprintf("data-%d", seed))
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := OpenFile(path, unix.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, data
}

func mustBuffer(t testing.TB, n int) *Buffer {
	t.Helper()
	b, err := AllocBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free() })
	return b
}

// run1 submits c, flushes until its callback ran, and returns it.
func run1(t testing.TB, e Engine, c *Completion) *Completion {
	t.Helper()
	ran := false
	c.Callback = func(*Completion) { ran = true }
	if err := e.Submit(c); err != nil {
		t.Fatalf("submit %s: %v", c.Op(), err)
	}
	for i := 0; !ran && i < 1000; i++ {
		if err := e.Flush(1); err != nil {
			t.Fatalf("flush: %v", err)
		}
	}
	if !ran {
		t.Fatalf("%s: callback never ran", c.Op())
	}
	return c
}

var ringConfigs = []struct {
	name   string
	cfg    Config
	locked bool // SingleIssuer rings: lock the goroutine to its thread
}{
	{"default", Config{Entries: 8, SQThreadCPU: -1}, false},
	{"no-mmap", Config{Entries: 8, SQThreadCPU: -1, NoMmap: true}, false},
	{"sqpoll", Config{Entries: 8, SQThreadCPU: -1, SQPoll: true, SQThreadIdleMs: 10}, false},
	{"sqpoll-aff", Config{Entries: 8, SQThreadCPU: 0, SQPoll: true, SQThreadIdleMs: 10}, false},
	{"coop-taskrun", Config{Entries: 8, SQThreadCPU: -1, CoopTaskrun: true}, false},
	{"defer-taskrun", Config{Entries: 8, SQThreadCPU: -1, SingleIssuer: true, DeferTaskrun: true}, true},
	{"no-mmap-sqpoll", Config{Entries: 8, SQThreadCPU: -1, NoMmap: true, SQPoll: true, SQThreadIdleMs: 10}, false},
}

// TestRoundTripAllOps writes random data through every write op and reads
// it back through every read op, on an O_DIRECT file, for every ring
// configuration, with and without registered files.
func TestRoundTripAllOps(t *testing.T) {
	for _, rc := range ringConfigs {
		for _, regFiles := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/regfiles=%v", rc.name, regFiles), func(t *testing.T) {
				if rc.locked {
					runtime.LockOSThread()
					defer runtime.UnlockOSThread()
				}
				r := newRingOrSkip(t, rc.cfg)
				roundTrip(t, r, regFiles, 42)
			})
		}
	}
}

func roundTrip(t *testing.T, e Engine, regFiles bool, seed uint64) {
	const blk = 4096
	const blocks = 8
	f, _ := directFile(t, t.TempDir(), blocks*blk, seed)
	if regFiles {
		if err := e.RegisterFiles([]*File{f}); err != nil {
			t.Fatal(err)
		}
	}
	wbuf := mustBuffer(t, blocks*blk)
	rbuf := mustBuffer(t, blocks*blk)
	if err := e.RegisterBuffers([]*Buffer{wbuf, rbuf}); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 2))
	for i := range wbuf.Bytes() {
		wbuf.Bytes()[i] = byte(rng.Uint32())
	}
	iov, err := NewIovecs(4)
	if err != nil {
		t.Fatal(err)
	}
	defer iov.Free()
	var c Completion
	check := func(what string, wantResult int64) {
		t.Helper()
		if c.Err != nil || c.Result != wantResult {
			t.Fatalf("%s: result %d err %v, want %d", what, c.Result, c.Err, wantResult)
		}
	}
	// Block 0-1: WRITE / READ.
	c.PrepWrite(f, wbuf.Addr(), 2*blk, 0)
	run1(t, e, &c)
	check("write", 2*blk)
	// Block 2-3: WRITE_FIXED.
	c.PrepWriteFixed(f, wbuf, 0, wbuf.Addr()+2*blk, 2*blk, 2*blk)
	run1(t, e, &c)
	check("write_fixed", 2*blk)
	// Blocks 4-7: WRITEV from two iovecs in reverse buffer order.
	iov.Append(wbuf.Addr()+4*blk, blk)
	iov.Append(wbuf.Addr()+5*blk, 3*blk)
	c.PrepWritev(f, iov, 4*blk)
	run1(t, e, &c)
	check("writev", 4*blk)
	c.PrepFsync(f)
	run1(t, e, &c)
	check("fsync", 0)
	c.PrepFdatasync(f)
	run1(t, e, &c)
	check("fdatasync", 0)

	c.PrepRead(f, rbuf.Addr(), 3*blk, 0)
	run1(t, e, &c)
	check("read", 3*blk)
	c.PrepReadFixed(f, rbuf, 1, rbuf.Addr()+3*blk, 2*blk, 3*blk)
	run1(t, e, &c)
	check("read_fixed", 2*blk)
	iov.Reset()
	iov.Append(rbuf.Addr()+5*blk, 2*blk)
	iov.Append(rbuf.Addr()+7*blk, blk)
	c.PrepReadv(f, iov, 5*blk)
	run1(t, e, &c)
	check("readv", 3*blk)
	if !bytes.Equal(wbuf.Bytes(), rbuf.Bytes()) {
		t.Fatalf("data read back differs from data written (seed %d)", seed)
	}
	if err := e.RegisterBuffers(nil); err != nil {
		t.Fatal(err)
	}
	if regFiles {
		if err := e.RegisterFiles(nil); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSQPollWakeup lets the SQPOLL thread go idle, then submits: the I/O
// must complete, which needs the IORING_SQ_NEED_WAKEUP wake-up.
func TestSQPollWakeup(t *testing.T) {
	r := newRingOrSkip(t, Config{Entries: 8, SQThreadCPU: -1, SQPoll: true, SQThreadIdleMs: 5})
	f, data := directFile(t, t.TempDir(), 4096, 6)
	buf := mustBuffer(t, 4096)
	var c Completion
	c.PrepNop()
	run1(t, r, &c)
	// Wait (bounded) for the thread to go to sleep.
	asleep := false
	for i := 0; i < 2000 && !asleep; i++ {
		time.Sleep(time.Millisecond)
		asleep = r.needsWakeup()
	}
	if !asleep {
		t.Fatal("SQPOLL thread never set IORING_SQ_NEED_WAKEUP after 5 ms idle")
	}
	before := r.Stats().Wakeups
	c.PrepRead(f, buf.Addr(), 4096, 0)
	run1(t, r, &c)
	if c.Err != nil || c.Result != 4096 || !bytes.Equal(buf.Bytes(), data) {
		t.Fatalf("read after wake-up: %d %v", c.Result, c.Err)
	}
	if r.Stats().Wakeups == before {
		t.Fatal("no wake-up was issued although the thread slept")
	}
}

// TestNoMmapLargeRing: app-provided ring memory spanning many pages (not a
// huge page unless hugetlb pages are reserved) doing real I/O.
func TestNoMmapLargeRing(t *testing.T) {
	r := newRingOrSkip(t, Config{Entries: 1024, SQThreadCPU: -1, NoMmap: true})
	l := r.Layout()
	if len(l.Regions) != 1 || l.Regions[0].Len <= 4096 {
		t.Fatalf("regions %+v: want one multi-page region", l.Regions)
	}
	t.Logf("NO_MMAP ring of %d bytes accepted (huge page: %v)", l.Regions[0].Len, r.HugePageRing())
	for _, a := range []uintptr{l.SQHead, l.SQTail, l.SQFlags, l.SQArray, l.SQEs, l.CQHead, l.CQTail, l.CQEs, l.SQMask, l.CQMask} {
		if a < l.Regions[0].Addr || a >= l.Regions[0].Addr+uintptr(l.Regions[0].Len) {
			t.Fatalf("layout address %#x outside the ring region %+v", a, l.Regions[0])
		}
	}
	f, data := directFile(t, t.TempDir(), 256*4096, 7)
	buf := mustBuffer(t, 256*4096)
	cs := make([]Completion, 256)
	for i := range cs {
		cs[i].PrepRead(f, buf.Addr()+uintptr(i*4096), 4096, uint64(i*4096))
		if err := r.Submit(&cs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Flush(256); err != nil {
		t.Fatal(err)
	}
	for i := range cs {
		if cs[i].Err != nil {
			t.Fatal(cs[i].Err)
		}
	}
	if !bytes.Equal(buf.Bytes(), data) {
		t.Fatal("wrong data through NO_MMAP ring")
	}
}

func TestLayoutMmap(t *testing.T) {
	r := newRingOrSkip(t, DefaultConfig())
	l := r.Layout()
	in := func(a uintptr) bool {
		for _, g := range l.Regions {
			if a >= g.Addr && a < g.Addr+uintptr(g.Len) {
				return true
			}
		}
		return false
	}
	for _, a := range []uintptr{l.SQHead, l.SQTail, l.SQFlags, l.SQArray, l.SQEs, l.CQHead, l.CQTail, l.CQEs, l.SQMask, l.CQMask} {
		if !in(a) {
			t.Fatalf("address %#x outside regions %+v", a, l.Regions)
		}
	}
	if l.SQEntries != 128 || l.CQEntries != 256 || l.SQESize != 64 || l.CQESize != 16 {
		t.Fatalf("layout %+v", l)
	}
}

// TestRegisteredFileOtherRing: a File registered on ring A keeps working on
// ring B (through its fd, not A's index), and unregistering resets Index.
func TestRegisteredFileOtherRing(t *testing.T) {
	a := newRingOrSkip(t, DefaultConfig())
	b := newRingOrSkip(t, DefaultConfig())
	dir := t.TempDir()
	f1, d1 := directFile(t, dir, 4096, 21)
	f2, d2 := directFile(t, dir, 4096, 22)
	if err := a.RegisterFiles([]*File{f1}); err != nil {
		t.Fatal(err)
	}
	if err := b.RegisterFiles([]*File{f2}); err != nil {
		t.Fatal(err)
	}
	if f1.Index != 0 || f2.Index != 0 {
		t.Fatalf("indexes %d %d", f1.Index, f2.Index)
	}
	buf := mustBuffer(t, 4096)
	var c Completion
	c.PrepRead(f1, buf.Addr(), 4096, 0) // f1.Index 0 is f2 on ring b
	run1(t, b, &c)
	if c.Err != nil || !bytes.Equal(buf.Bytes(), d1) {
		t.Fatalf("read of f1 on ring b: %v, data from the right file: %v", c.Err, bytes.Equal(buf.Bytes(), d1))
	}
	c.PrepRead(f2, buf.Addr(), 4096, 0)
	run1(t, b, &c)
	if c.Err != nil || !bytes.Equal(buf.Bytes(), d2) {
		t.Fatal("read of f2 on ring b")
	}
	if err := a.RegisterFiles(nil); err != nil {
		t.Fatal(err)
	}
	if f1.Index != -1 {
		t.Fatalf("Index %d after unregistering, want -1", f1.Index)
	}
}

// Views of one mapping register as separate fixed buffers (the GPU path
// registers its staging pool slot by slot) and READ_FIXED into each lands in
// the right place; a view cannot be freed, nor made past its parent's end.
func TestBufferViewsAsFixedBuffers(t *testing.T) {
	const blk = 4096
	r := newRingOrSkip(t, DefaultConfig())
	f, want := directFile(t, t.TempDir(), 4*blk, 9)
	parent := mustBuffer(t, 4*blk)
	var views []*Buffer
	for i := 0; i < 4; i++ {
		v, err := parent.View(i*blk, blk)
		if err != nil {
			t.Fatal(err)
		}
		views = append(views, v)
	}
	for _, bad := range []struct{ off, n int }{{-1, blk}, {0, 0}, {3 * blk, 2 * blk}, {5 * blk, blk}} {
		if _, err := parent.View(bad.off, bad.n); !errors.Is(err, ErrInvalid) {
			t.Fatalf("View(%d, %d): err %v, want ErrInvalid", bad.off, bad.n, err)
		}
	}
	if err := views[0].Free(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Free of a view: err %v, want ErrInvalid", err)
	}
	if err := r.RegisterBuffers(views); err != nil {
		t.Fatal(err)
	}
	var c Completion
	for i := 0; i < 4; i++ {
		// Buffer index i, file block 3-i: reversed, so a wrong index shows.
		c.PrepReadFixed(f, views[i], uint16(i), views[i].Addr(), blk, uint64(3-i)*blk)
		run1(t, r, &c)
		if c.Err != nil || c.Result != blk {
			t.Fatalf("read_fixed into view %d: result %d err %v", i, c.Result, c.Err)
		}
	}
	for i := 0; i < 4; i++ {
		if !bytes.Equal(parent.Bytes()[i*blk:(i+1)*blk], want[(3-i)*blk:(4-i)*blk]) {
			t.Fatalf("view %d holds the wrong bytes", i)
		}
	}
	if err := r.RegisterBuffers(nil); err != nil {
		t.Fatal(err)
	}
}

// TestDisabledRingHandoff: a DeferTaskrun ring created disabled on one
// thread refuses I/O until enabled; the thread that enables it becomes its
// issuer (round trip of every op there), and another thread is then refused.
func TestDisabledRingHandoff(t *testing.T) {
	r := newRingOrSkip(t, Config{Entries: 8, SQThreadCPU: -1, DeferTaskrun: true, Disabled: true})
	f, _ := directFile(t, t.TempDir(), 4096, 3)
	buf := mustBuffer(t, 4096)
	var c Completion
	c.PrepRead(f, buf.Addr(), 4096, 0)
	if err := r.Submit(&c); err != nil {
		t.Fatal(err)
	}
	if err := r.Flush(1); !errors.Is(err, unix.EBADFD) {
		t.Fatalf("Flush on a disabled ring: %v, want EBADFD", err)
	}
	r.Close() // the refused read never reached the kernel
	r = newRingOrSkip(t, Config{Entries: 8, SQThreadCPU: -1, DeferTaskrun: true, Disabled: true})
	done := make(chan error)
	back := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := r.Enable(); err != nil {
			done <- err
			return
		}
		finished := false
		defer func() {
			if !finished { // roundTrip called t.Fatal (Goexit): unblock the test
				done <- errors.New("round trip on the issuer thread failed")
			}
		}()
		roundTrip(t, r, true, 7)
		finished = true
		done <- nil
		<-back // keep this thread (the issuer) alive while the other one tries
		done <- r.RegisterBuffers(nil)
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// This goroutine cannot be on the locked thread above.
	err := r.RegisterBuffers([]*Buffer{buf})
	t.Logf("register from another thread: %v", err)
	if !errors.Is(err, unix.EEXIST) {
		t.Errorf("register from a thread that is not the issuer: %v, want EEXIST", err)
	}
	close(back)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := r.Enable(); err == nil {
		t.Fatal("enabling an enabled ring succeeded")
	}
}
