package uring

// What the ring does with bad input and failures: misaligned buffers, a full
// queue, short reads, EOF, errnos, closing with I/O in flight.

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestAlignmentErrors(t *testing.T) {
	r := newRingOrSkip(t, DefaultConfig())
	f, _ := directFile(t, t.TempDir(), 64<<10, 1)
	buf := mustBuffer(t, 64<<10)
	if err := r.RegisterBuffers([]*Buffer{buf}); err != nil {
		t.Fatal(err)
	}
	a := uintptr(f.DirectAlign)
	iov, err := NewIovecs(2)
	if err != nil {
		t.Fatal(err)
	}
	defer iov.Free()
	for _, tc := range []struct {
		name string
		prep func(c *Completion)
		what string
	}{
		{"read buffer", func(c *Completion) { c.PrepRead(f, buf.Addr()+1, uint32(a), 0) }, "buffer"},
		{"read offset", func(c *Completion) { c.PrepRead(f, buf.Addr(), uint32(a), 7) }, "offset"},
		{"read length", func(c *Completion) { c.PrepRead(f, buf.Addr(), uint32(a)+100, 0) }, "length"},
		{"write buffer", func(c *Completion) { c.PrepWrite(f, buf.Addr()+a/2, uint32(a), 0) }, "buffer"},
		{"write offset", func(c *Completion) { c.PrepWrite(f, buf.Addr(), uint32(a), uint64(a)+1) }, "offset"},
		{"write length", func(c *Completion) { c.PrepWrite(f, buf.Addr(), 1, 0) }, "length"},
		{"read_fixed buffer", func(c *Completion) { c.PrepReadFixed(f, buf, 0, buf.Addr()+8, uint32(a), 0) }, "buffer"},
		{"write_fixed length", func(c *Completion) { c.PrepWriteFixed(f, buf, 0, buf.Addr(), uint32(a)-1, 0) }, "length"},
		{"readv buffer", func(c *Completion) {
			iov.Reset()
			iov.Append(buf.Addr(), int(a))
			iov.Append(buf.Addr()+a+3, int(a))
			c.PrepReadv(f, iov, 0)
		}, "buffer"},
		{"writev length", func(c *Completion) {
			iov.Reset()
			iov.Append(buf.Addr(), int(a)+1)
			c.PrepWritev(f, iov, 0)
		}, "length"},
		{"readv offset", func(c *Completion) {
			iov.Reset()
			iov.Append(buf.Addr(), int(a))
			c.PrepReadv(f, iov, 1)
		}, "offset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Completion
			tc.prep(&c)
			err := r.Submit(&c)
			var ae *AlignmentError
			if !errors.As(err, &ae) || !errors.Is(err, ErrMisaligned) || ae.What != tc.what {
				t.Fatalf("Submit: %v, want *AlignmentError about %s wrapping ErrMisaligned", err, tc.what)
			}
			if r.InFlight() != 0 {
				t.Fatalf("misaligned request was queued")
			}
		})
	}
}

// TestOverflow submits far more I/O than the SQ holds; all of it must
// complete, correctly, through the overflow queue.
func TestOverflow(t *testing.T) {
	r := newRingOrSkip(t, Config{Entries: 4, SQThreadCPU: -1, MaxInFlight: 6})
	const blk, n = 4096, 200
	f, data := directFile(t, t.TempDir(), 16*blk, 3)
	buf := mustBuffer(t, n*blk)
	cs := make([]Completion, n)
	done := 0
	for i := range cs {
		cs[i].PrepRead(f, buf.Addr()+uintptr(i*blk), blk, uint64(i%16*blk))
		cs[i].UserData = uint64(i)
		cs[i].Callback = func(c *Completion) {
			if c.Err != nil || c.Result != blk {
				t.Errorf("read %d: %d %v", c.UserData, c.Result, c.Err)
			}
			done++
		}
		if err := r.Submit(&cs[i]); err != nil {
			t.Fatal(err)
		}
		if r.inKernel > r.MaxInFlight() {
			t.Fatalf("%d in kernel > MaxInFlight %d", r.inKernel, r.MaxInFlight())
		}
	}
	if r.InFlight() != n {
		t.Fatalf("InFlight %d, want %d", r.InFlight(), n)
	}
	for r.InFlight() > 0 {
		if err := r.Flush(1); err != nil {
			t.Fatal(err)
		}
	}
	if done != n {
		t.Fatalf("%d callbacks, want %d", done, n)
	}
	for i := 0; i < n; i++ {
		if !bytes.Equal(buf.Bytes()[i*blk:(i+1)*blk], data[i%16*blk:(i%16+1)*blk]) {
			t.Fatalf("read %d: wrong data", i)
		}
	}
	if st := r.Stats(); st.Overflowed == 0 || st.Completed != n {
		t.Fatalf("stats %+v: want overflow use and %d completed", st, n)
	}
}

// TestShortReadPipe: a read of a pipe returns what is there; the engine must
// continue for the rest, and finish at EOF with Result < requested.
func TestShortReadPipe(t *testing.T) {
	r := newRingOrSkip(t, DefaultConfig())
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	wfd := p[1]
	defer func() {
		if wfd >= 0 {
			unix.Close(wfd)
		}
	}()
	payload := make([]byte, 3000)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	if _, err := unix.Write(wfd, payload[:1000]); err != nil {
		t.Fatal(err)
	}
	rf := NewFile(p[0], 0, "pipe")
	buf := mustBuffer(t, 4096)
	var c Completion
	ran := false
	c.PrepRead(rf, buf.Addr(), 4096, 0)
	c.Callback = func(*Completion) { ran = true }
	if err := r.Submit(&c); err != nil {
		t.Fatal(err)
	}
	// Wait (bounded) until the first, short read came back and was continued.
	for i := 0; r.Stats().Continuations == 0 && i < 10000; i++ {
		if err := r.Flush(0); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Microsecond)
	}
	if r.Stats().Continuations == 0 || ran {
		t.Fatalf("short read was not continued: stats %+v ran %v", r.Stats(), ran)
	}
	if _, err := unix.Write(wfd, payload[1000:]); err != nil {
		t.Fatal(err)
	}
	unix.Close(wfd)
	wfd = -1
	for i := 0; !ran && i < 100; i++ {
		if err := r.Flush(1); err != nil {
			t.Fatal(err)
		}
	}
	if !ran || c.Err != nil || c.Result != 3000 {
		t.Fatalf("ran %v result %d err %v, want 3000 bytes to EOF", ran, c.Result, c.Err)
	}
	if !bytes.Equal(buf.Bytes()[:3000], payload) {
		t.Fatal("wrong data")
	}
}

// TestReadAtEOF: a read spanning EOF of a regular file completes with the
// bytes that exist and no error.
func TestReadAtEOF(t *testing.T) {
	r := newRingOrSkip(t, DefaultConfig())
	f, data := directFile(t, t.TempDir(), 3*4096, 4)
	buf := mustBuffer(t, 8*4096)
	var c Completion
	c.PrepRead(f, buf.Addr(), 8*4096, 4096)
	run1(t, r, &c)
	if c.Err != nil || c.Result != 2*4096 || !bytes.Equal(buf.Bytes()[:2*4096], data[4096:]) {
		t.Fatalf("result %d err %v, want %d bytes", c.Result, c.Err, 2*4096)
	}
}

// TestErrnoOnItsCompletion: an errno goes to the completion that caused it,
// not to its neighbours, wrapped with the op.
func TestErrnoOnItsCompletion(t *testing.T) {
	r := newRingOrSkip(t, DefaultConfig())
	f, _ := directFile(t, t.TempDir(), 4096, 5)
	ro, err := OpenFile(f.Path, unix.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	buf := mustBuffer(t, 3*4096)
	cs := make([]Completion, 3)
	cs[0].PrepRead(f, buf.Addr(), 4096, 0)
	cs[1].PrepWrite(ro, buf.Addr()+4096, 4096, 0) // EBADF: not open for writing
	cs[2].PrepRead(f, buf.Addr()+8192, 4096, 0)
	for i := range cs {
		if err := r.Submit(&cs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Flush(3); err != nil {
		t.Fatal(err)
	}
	if cs[0].Err != nil || cs[2].Err != nil || !errors.Is(cs[1].Err, unix.EBADF) {
		t.Fatalf("errors %v / %v / %v, want only the write to fail with EBADF", cs[0].Err, cs[1].Err, cs[2].Err)
	}
}

func TestCloseWithInFlight(t *testing.T) {
	r, err := New(DefaultConfig())
	if err != nil {
		t.Skip(err)
	}
	var c Completion
	c.PrepNop()
	if err := r.Submit(&c); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Close with I/O in flight: %v, want ErrInvalid", err)
	}
	if err := r.Flush(1); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Submit(&c); !errors.Is(err, ErrClosed) {
		t.Fatalf("Submit after Close: %v", err)
	}
}
