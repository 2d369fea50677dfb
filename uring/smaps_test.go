package uring

import (
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const smapsSample = `55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0                          [heap]
Size:                132 kB
AnonHugePages:         0 kB
7f0000000000-7f0000600000 rw-p 00000000 00:00 0 
Size:               6144 kB
Rss:                6144 kB
AnonHugePages:      4096 kB
VmFlags: rd wr mr mw me ac hg
7f0000600000-7f0000601000 r--p 00000000 08:01 42                         /usr/lib/x
Size:                  4 kB
`

func TestAnonHugeKB(t *testing.T) {
	for _, c := range []struct {
		name string
		in   string
		addr uintptr
		kb   int64
		ok   bool
	}{
		{"heap", smapsSample, 0x55d0c0000010, 0, true},
		{"huge mapping", smapsSample, 0x7f0000200000, 4096, true},
		{"last byte of it", smapsSample, 0x7f00005fffff, 4096, true},
		{"mapping without the field", smapsSample, 0x7f0000600000, 0, false},
		{"no mapping", smapsSample, 0x1000, 0, false},
		{"bad unit", "1000-2000 rw-p 0 0:0 0\nAnonHugePages: 4 MB\n", 0x1000, 0, false},
		{"negative", "1000-2000 rw-p 0 0:0 0\nAnonHugePages: -4 kB\n", 0x1000, 0, false},
		{"empty", "", 0x1000, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			kb, ok := anonHugeKB([]byte(c.in), c.addr)
			if kb != c.kb || ok != c.ok {
				t.Fatalf("anonHugeKB = %d, %v; want %d, %v", kb, ok, c.kb, c.ok)
			}
		})
	}
}

func FuzzAnonHugeKB(f *testing.F) {
	f.Add([]byte(smapsSample), uint64(0x7f0000200000))
	f.Add([]byte("1-2 x\nAnonHugePages: 9 kB\n"), uint64(1))
	f.Fuzz(func(t *testing.T, b []byte, addr uint64) {
		kb, ok := anonHugeKB(b, uintptr(addr))
		if kb < 0 || (!ok && kb != 0) {
			t.Fatalf("anonHugeKB = %d, %v", kb, ok)
		}
	})
}

// TestAllocBufferHuge: a 2 MiB-or-larger buffer is 2 MiB aligned, fully
// usable, and freed through its whole mapping; Huge matches smaps.
func TestAllocBufferHuge(t *testing.T) {
	for _, n := range []int{4096, hugeBytes - 1, hugeBytes, 3*hugeBytes + 5} {
		b, err := AllocBuffer(n)
		if err != nil {
			t.Fatal(err)
		}
		if b.Len() != n {
			t.Fatalf("Len %d, want %d", b.Len(), n)
		}
		if n >= hugeBytes && b.Addr()%hugeBytes != 0 {
			t.Fatalf("%d-byte buffer at %#x: not 2 MiB aligned", n, b.Addr())
		}
		m := b.Bytes()
		m[0], m[n-1] = 1, 2
		if b.Huge() != hugeBacked(b.Addr(), (n+hugeBytes-1)/hugeBytes*hugeBytes) || (n < hugeBytes && b.Huge()) {
			t.Fatalf("%d bytes: Huge %v disagrees with smaps", n, b.Huge())
		}
		t.Logf("%d bytes: huge %v", n, b.Huge())
		if b.HugeNow() != b.Huge() {
			t.Fatalf("%d bytes: HugeNow %v right after allocation, Huge %v", n, b.HugeNow(), b.Huge())
		}
		if err := b.Free(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestThreadCPUTimeClock: the CPU-time clock of a thread read from another
// thread of the process agrees with the thread's own CLOCK_THREAD_CPUTIME_ID.
func TestThreadCPUTimeClock(t *testing.T) {
	type sample struct {
		tid int
		own time.Duration
	}
	got := make(chan sample)
	release := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for start := time.Now(); time.Since(start) < 30*time.Millisecond; {
		}
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
			panic(err)
		}
		got <- sample{unix.Gettid(), time.Duration(ts.Nano())}
		<-release // stay off the CPU while the other thread reads the clock
	}()
	s := <-got
	d, err := ThreadCPUTime(s.tid)
	close(release)
	if err != nil {
		t.Fatal(err)
	}
	if d < s.own || d > s.own+5*time.Millisecond {
		t.Fatalf("thread %d: ThreadCPUTime %v, its own clock %v", s.tid, d, s.own)
	}
}
