package uringsim

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tutti-io/tutti/uring"
)

// iovEntries lists the (address, length) of every entry of v.
func iovEntries(v *uring.Iovecs) [][2]uint64 {
	var out [][2]uint64
	for i := 0; i < v.Len(); i++ {
		a, n := v.At(i)
		out = append(out, [2]uint64{uint64(a), uint64(n)})
	}
	return out
}

// directFile creates a file of sizeBytes random bytes (seeded) and opens it
// with O_DIRECT; it returns the file and its content.
func directFile(t testing.TB, dir string, sizeBytes int, seed uint64) (*uring.File, []byte) {
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
	f, err := uring.OpenFile(path, unix.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, data
}

func mustBuffer(t testing.TB, n int) *uring.Buffer {
	t.Helper()
	b, err := uring.AllocBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free() })
	return b
}

// run1 submits c, flushes until its callback ran, and returns it.
func run1(t testing.TB, e uring.Engine, c *uring.Completion) *uring.Completion {
	t.Helper()
	ran := false
	c.Callback = func(*uring.Completion) { ran = true }
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

func roundTrip(t *testing.T, e uring.Engine, regFiles bool, seed uint64) {
	const blk = 4096
	const blocks = 8
	f, _ := directFile(t, t.TempDir(), blocks*blk, seed)
	if regFiles {
		if err := e.RegisterFiles([]*uring.File{f}); err != nil {
			t.Fatal(err)
		}
	}
	wbuf := mustBuffer(t, blocks*blk)
	rbuf := mustBuffer(t, blocks*blk)
	if err := e.RegisterBuffers([]*uring.Buffer{wbuf, rbuf}); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 2))
	for i := range wbuf.Bytes() {
		wbuf.Bytes()[i] = byte(rng.Uint32())
	}
	iov, err := uring.NewIovecs(4)
	if err != nil {
		t.Fatal(err)
	}
	defer iov.Free()
	var c uring.Completion
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

func TestSimRoundTrip(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		s := New(Config{Seed: seed, MaxLatencyTicks: 5})
		t.Run(s.Recipe(), func(t *testing.T) { roundTrip(t, s, seed%2 == 0, seed) })
	}
}

// TestSimShortRead: injected short reads are continued until the whole
// request is in, with the right data.
func TestSimShortRead(t *testing.T) {
	for _, seed := range []uint64{1, 7, 99} {
		s := New(Config{Seed: seed, MaxInFlight: 4, Injectors: []Injector{&ShortRead{P: 0.7}}})
		t.Run(s.Recipe(), func(t *testing.T) {
			const blk, n = 4096, 32
			f, data := directFile(t, t.TempDir(), n*blk, seed)
			buf := mustBuffer(t, n*blk)
			cs := make([]uring.Completion, n/4)
			for i := range cs {
				cs[i].PrepRead(f, buf.Addr()+uintptr(i*4*blk), 4*blk, uint64(i*4*blk))
				if err := s.Submit(&cs[i]); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Flush(len(cs)); err != nil {
				t.Fatal(err)
			}
			for i := range cs {
				if cs[i].Err != nil || cs[i].Result != 4*blk {
					t.Fatalf("%s: read %d: %d %v", s.Recipe(), i, cs[i].Result, cs[i].Err)
				}
			}
			if !bytes.Equal(buf.Bytes(), data) {
				t.Fatalf("%s: wrong data", s.Recipe())
			}
			if s.Stats().Continuations == 0 {
				t.Fatalf("%s: no short read was injected: %+v", s.Recipe(), s.Stats())
			}
		})
	}
}

// TestSimShortReadv: a short vectored read is continued across iovec
// boundaries and the iovecs are restored before the callback.
func TestSimShortReadv(t *testing.T) {
	s := New(Config{Seed: 5, Injectors: []Injector{&ShortRead{P: 1}}})
	f, data := directFile(t, t.TempDir(), 16*4096, 5)
	buf := mustBuffer(t, 16*4096)
	iov, err := uring.NewIovecs(3)
	if err != nil {
		t.Fatal(err)
	}
	defer iov.Free()
	iov.Append(buf.Addr(), 4*4096)
	iov.Append(buf.Addr()+4*4096, 4096)
	iov.Append(buf.Addr()+5*4096, 11*4096)
	orig := iovEntries(iov)
	var c uring.Completion
	c.PrepReadv(f, iov, 0)
	run1(t, s, &c)
	if c.Err != nil || c.Result != 16*4096 || !bytes.Equal(buf.Bytes(), data) {
		t.Fatalf("%s: readv %d %v", s.Recipe(), c.Result, c.Err)
	}
	if got := iovEntries(iov); !slices.Equal(orig, got) {
		t.Fatalf("iovecs not restored: %v, want %v", got, orig)
	}
	if s.Stats().Continuations == 0 {
		t.Fatal("no continuation")
	}
}

// TestSimFaultsOnTheirCompletion: each injected fault arrives on the
// completion it was meant for, wrapped with the op, and nowhere else.
func TestSimFaultsOnTheirCompletion(t *testing.T) {
	const blk = 4096
	for _, tc := range []struct {
		name   string
		inj    Injector
		ops    []uring.Op // submitted in this order, each on its own block
		failed []int
		errno  unix.Errno
	}{
		{"third write EIO", &EIO{Nth: 3, Ops: WriteOps}, []uring.Op{uring.OpWrite, uring.OpRead, uring.OpWrite, uring.OpRead, uring.OpWrite, uring.OpWrite}, []int{4}, unix.EIO},
		{"second read EIO", &EIO{Nth: 2, Ops: ReadOps}, []uring.Op{uring.OpWrite, uring.OpRead, uring.OpWrite, uring.OpRead, uring.OpRead}, []int{3}, unix.EIO},
		{"fsync EIO", &EIO{Nth: 1, Ops: SyncOps}, []uring.Op{uring.OpWrite, uring.OpFsync, uring.OpRead}, []int{1}, unix.EIO},
		{"enospc after 2 blocks", &ENOSPC{AfterBytes: 2 * blk}, []uring.Op{uring.OpWrite, uring.OpRead, uring.OpWrite, uring.OpWrite, uring.OpWrite}, []int{3, 4}, unix.ENOSPC},
	} {
		// MaxInFlight 1 makes completion order = submission order, so the
		// expectation does not depend on the seed.
		s := New(Config{Seed: 11, MaxInFlight: 1, Injectors: []Injector{tc.inj}})
		t.Run(tc.name, func(t *testing.T) {
			f, _ := directFile(t, t.TempDir(), 8*blk, 11)
			buf := mustBuffer(t, 8*blk)
			cs := make([]uring.Completion, len(tc.ops))
			for i, op := range tc.ops {
				addr, off := buf.Addr()+uintptr(i*blk), uint64(i*blk)
				switch op {
				case uring.OpWrite:
					cs[i].PrepWrite(f, addr, blk, off)
				case uring.OpRead:
					cs[i].PrepRead(f, addr, blk, off)
				case uring.OpFsync:
					cs[i].PrepFsync(f)
				}
				if err := s.Submit(&cs[i]); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Flush(len(cs)); err != nil {
				t.Fatal(err)
			}
			for i := range cs {
				want := slices.Contains(tc.failed, i)
				if got := cs[i].Err != nil; got != want {
					t.Fatalf("%s: op %d (%s): err %v, want failure %v", s.Recipe(), i, tc.ops[i], cs[i].Err, want)
				}
				if want && !errors.Is(cs[i].Err, tc.errno) {
					t.Fatalf("%s: op %d: %v, want %v", s.Recipe(), i, cs[i].Err, tc.errno)
				}
			}
		})
	}
}

// TestSimDeterministic: the same seed gives the same completion order and
// the same faults; another seed differs.
func TestSimDeterministic(t *testing.T) {
	dir := t.TempDir()
	f, _ := directFile(t, dir, 64*4096, 1)
	buf := mustBuffer(t, 64*4096)
	runOnce := func(seed uint64) (order []uint64, failed []uint64) {
		s := New(Config{Seed: seed, MaxLatencyTicks: 9, Injectors: []Injector{&EIO{P: 0.3, Ops: ReadOps}}})
		cs := make([]uring.Completion, 64)
		for i := range cs {
			cs[i].PrepRead(f, buf.Addr()+uintptr(i*4096), 4096, uint64(i*4096))
			cs[i].UserData = uint64(i)
			cs[i].Callback = func(c *uring.Completion) {
				order = append(order, c.UserData)
				if c.Err != nil {
					failed = append(failed, c.UserData)
				}
			}
			if err := s.Submit(&cs[i]); err != nil {
				t.Fatal(err)
			}
		}
		for s.InFlight() > 0 {
			if err := s.Flush(0); err != nil {
				t.Fatal(err)
			}
		}
		return order, failed
	}
	o1, f1 := runOnce(42)
	o2, f2 := runOnce(42)
	o3, _ := runOnce(43)
	if !slices.Equal(o1, o2) || !slices.Equal(f1, f2) {
		t.Fatalf("seed 42 not reproducible:\n%v\n%v", o1, o2)
	}
	if slices.Equal(o1, o3) {
		t.Fatalf("seeds 42 and 43 gave the same order")
	}
	if len(f1) == 0 || len(f1) == 64 {
		t.Fatalf("eio(p=0.3) failed %d of 64", len(f1))
	}
}

// TestSimCrashTornWrite: writes in flight at Crash leave a sector prefix of
// new data followed by old data, complete with uring.ErrCrashed, and later ops
// fail with uring.ErrCrashed.
func TestSimCrashTornWrite(t *testing.T) {
	const blk, n = 8 * 512, 6
	for _, seed := range []uint64{3, 4, 5} {
		s := New(Config{Seed: seed, MinLatencyTicks: 100, MaxLatencyTicks: 200, Injectors: []Injector{TornWrite{}}})
		t.Run(s.Recipe(), func(t *testing.T) {
			f, old := directFile(t, t.TempDir(), n*blk, seed)
			buf := mustBuffer(t, n*blk)
			rng := rand.New(rand.NewPCG(seed, 9))
			for i := range buf.Bytes() {
				buf.Bytes()[i] = byte(rng.Uint32())
			}
			cs := make([]uring.Completion, n)
			for i := range cs {
				cs[i].PrepWrite(f, buf.Addr()+uintptr(i*blk), blk, uint64(i*blk))
				if err := s.Submit(&cs[i]); err != nil {
					t.Fatal(err)
				}
			}
			s.Flush(0) // one tick: nothing is due yet
			s.Crash()
			if s.InFlight() != n {
				t.Fatalf("InFlight %d after Crash, want %d until the callbacks ran", s.InFlight(), n)
			}
			for s.InFlight() > 0 {
				if err := s.Flush(1); err != nil {
					t.Fatal(err)
				}
			}
			got, err := os.ReadFile(f.Path)
			if err != nil {
				t.Fatal(err)
			}
			torn := 0
			for i := range cs {
				if !errors.Is(cs[i].Err, uring.ErrCrashed) {
					t.Fatalf("%s: write %d: %v, want uring.ErrCrashed", s.Recipe(), i, cs[i].Err)
				}
				g, nw, o := got[i*blk:(i+1)*blk], buf.Bytes()[i*blk:(i+1)*blk], old[i*blk:(i+1)*blk]
				prefix := 0 // length of the new-data prefix, in whole sectors
				for prefix < blk && bytes.Equal(g[prefix:prefix+512], nw[prefix:prefix+512]) {
					prefix += 512
				}
				if !bytes.Equal(g[prefix:], o[prefix:]) {
					t.Fatalf("%s: write %d: after a %d-byte new prefix the rest is not the old data", s.Recipe(), i, prefix)
				}
				if prefix > 0 && prefix < blk {
					torn++
				}
			}
			var c uring.Completion
			c.PrepRead(f, buf.Addr(), blk, 0)
			if err := s.Submit(&c); !errors.Is(err, uring.ErrCrashed) {
				t.Fatalf("submit after crash: %v", err)
			}
			if s.Stats().TornWrites == 0 {
				t.Fatalf("%s: no write was torn", s.Recipe())
			}
			t.Logf("%s: %d of %d writes torn mid-way, stats %+v", s.Recipe(), torn, n, s.Stats())
		})
	}
}

func TestSimRecipe(t *testing.T) {
	s := New(Config{Seed: 7, Injectors: []Injector{&EIO{P: 0.05, Ops: ReadOps}, &ShortRead{P: 0.1}, &ENOSPC{AfterBytes: 1 << 20}, TornWrite{}}})
	want := "seed=7 eio(p=0.05,op=read)+short-read(p=0.1)+enospc(after=1048576)+torn-write(at=crash)"
	if got := s.Recipe(); got != want {
		t.Fatalf("recipe %q, want %q", got, want)
	}
	if got := New(Config{Seed: 3}).Recipe(); got != "seed=3 none" {
		t.Fatal(got)
	}
}

func BenchmarkSimRead(b *testing.B) {
	s := New(Config{Seed: 1})
	f, _ := directFile(b, b.TempDir(), 1<<20, 1)
	buf := mustBuffer(b, 4096)
	var c uring.Completion
	b.SetBytes(4096)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.PrepRead(f, buf.Addr(), 4096, uint64(i%256)*4096)
		if err := s.Submit(&c); err != nil {
			b.Fatal(err)
		}
		if err := s.Flush(1); err != nil {
			b.Fatal(err)
		}
	}
}
