package uring

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

func TestSimRoundTrip(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		s := NewSim(SimConfig{Seed: seed, MaxLatencyTicks: 5})
		t.Run(s.Recipe(), func(t *testing.T) { roundTrip(t, s, seed%2 == 0, seed) })
	}
}

// TestSimShortRead: injected short reads are continued until the whole
// request is in, with the right data.
func TestSimShortRead(t *testing.T) {
	for _, seed := range []uint64{1, 7, 99} {
		s := NewSim(SimConfig{Seed: seed, MaxInFlight: 4, Injectors: []Injector{&ShortRead{P: 0.7}}})
		t.Run(s.Recipe(), func(t *testing.T) {
			const blk, n = 4096, 32
			f, data := directFile(t, t.TempDir(), n*blk, seed)
			buf := mustBuffer(t, n*blk)
			cs := make([]Completion, n/4)
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
	s := NewSim(SimConfig{Seed: 5, Injectors: []Injector{&ShortRead{P: 1}}})
	f, data := directFile(t, t.TempDir(), 16*4096, 5)
	buf := mustBuffer(t, 16*4096)
	iov, err := NewIovecs(3)
	if err != nil {
		t.Fatal(err)
	}
	defer iov.Free()
	iov.Append(buf.Addr(), 4*4096)
	iov.Append(buf.Addr()+4*4096, 4096)
	iov.Append(buf.Addr()+5*4096, 11*4096)
	orig := make([]iovec, 3)
	copy(orig, iov.vec[:3])
	var c Completion
	c.PrepReadv(f, iov, 0)
	run1(t, s, &c)
	if c.Err != nil || c.Result != 16*4096 || !bytes.Equal(buf.Bytes(), data) {
		t.Fatalf("%s: readv %d %v", s.Recipe(), c.Result, c.Err)
	}
	if !slices.Equal(orig, iov.vec[:3]) {
		t.Fatalf("iovecs not restored: %v, want %v", iov.vec[:3], orig)
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
		ops    []Op // submitted in this order, each on its own block
		failed []int
		errno  unix.Errno
	}{
		{"third write EIO", &EIO{Nth: 3, Ops: WriteOps}, []Op{OpWrite, OpRead, OpWrite, OpRead, OpWrite, OpWrite}, []int{4}, unix.EIO},
		{"second read EIO", &EIO{Nth: 2, Ops: ReadOps}, []Op{OpWrite, OpRead, OpWrite, OpRead, OpRead}, []int{3}, unix.EIO},
		{"fsync EIO", &EIO{Nth: 1, Ops: SyncOps}, []Op{OpWrite, OpFsync, OpRead}, []int{1}, unix.EIO},
		{"enospc after 2 blocks", &ENOSPC{AfterBytes: 2 * blk}, []Op{OpWrite, OpRead, OpWrite, OpWrite, OpWrite}, []int{3, 4}, unix.ENOSPC},
	} {
		// MaxInFlight 1 makes completion order = submission order, so the
		// expectation does not depend on the seed.
		s := NewSim(SimConfig{Seed: 11, MaxInFlight: 1, Injectors: []Injector{tc.inj}})
		t.Run(tc.name, func(t *testing.T) {
			f, _ := directFile(t, t.TempDir(), 8*blk, 11)
			buf := mustBuffer(t, 8*blk)
			cs := make([]Completion, len(tc.ops))
			for i, op := range tc.ops {
				addr, off := buf.Addr()+uintptr(i*blk), uint64(i*blk)
				switch op {
				case OpWrite:
					cs[i].PrepWrite(f, addr, blk, off)
				case OpRead:
					cs[i].PrepRead(f, addr, blk, off)
				case OpFsync:
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
		s := NewSim(SimConfig{Seed: seed, MaxLatencyTicks: 9, Injectors: []Injector{&EIO{P: 0.3, Ops: ReadOps}}})
		cs := make([]Completion, 64)
		for i := range cs {
			cs[i].PrepRead(f, buf.Addr()+uintptr(i*4096), 4096, uint64(i*4096))
			cs[i].UserData = uint64(i)
			cs[i].Callback = func(c *Completion) {
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
// new data followed by old data, complete with ErrCrashed, and later ops
// fail with ErrCrashed.
func TestSimCrashTornWrite(t *testing.T) {
	const blk, n = 8 * 512, 6
	for _, seed := range []uint64{3, 4, 5} {
		s := NewSim(SimConfig{Seed: seed, MinLatencyTicks: 100, MaxLatencyTicks: 200, Injectors: []Injector{TornWrite{}}})
		t.Run(s.Recipe(), func(t *testing.T) {
			f, old := directFile(t, t.TempDir(), n*blk, seed)
			buf := mustBuffer(t, n*blk)
			rng := rand.New(rand.NewPCG(seed, 9))
			for i := range buf.Bytes() {
				buf.Bytes()[i] = byte(rng.Uint32())
			}
			cs := make([]Completion, n)
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
				if !errors.Is(cs[i].Err, ErrCrashed) {
					t.Fatalf("%s: write %d: %v, want ErrCrashed", s.Recipe(), i, cs[i].Err)
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
			var c Completion
			c.PrepRead(f, buf.Addr(), blk, 0)
			if err := s.Submit(&c); !errors.Is(err, ErrCrashed) {
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
	s := NewSim(SimConfig{Seed: 7, Injectors: []Injector{&EIO{P: 0.05, Ops: ReadOps}, &ShortRead{P: 0.1}, &ENOSPC{AfterBytes: 1 << 20}, TornWrite{}}})
	want := "seed=7 eio(p=0.05,op=read)+short-read(p=0.1)+enospc(after=1048576)+torn-write(at=crash)"
	if got := s.Recipe(); got != want {
		t.Fatalf("recipe %q, want %q", got, want)
	}
	if got := NewSim(SimConfig{Seed: 3}).Recipe(); got != "seed=3 none" {
		t.Fatal(got)
	}
}
