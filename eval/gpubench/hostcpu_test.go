package gpubench

import (
	"math"
	"testing"
)

const procStat = `cpu  100 5 50 800 20 3 2 10 7 0
cpu0 50 2 25 400 10 1 1 5 0 0
cpu1 50 3 25 400 10 2 1 5 0 0
intr 12345
ctxt 999
`

func TestParseProcStat(t *testing.T) {
	h, err := parseProcStat([]byte(procStat))
	if err != nil {
		t.Fatal(err)
	}
	// busy: user+nice+system+irq+softirq+steal; guest is inside user.
	if h.busy != 100+5+50+3+2+10 || h.total != h.busy+800+20 || h.cpus != 2 {
		t.Fatalf("parsed %+v", h)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4\n", "cpu 1 2 3\ncpu0 1 2 3 4\n", "cpu 1 x 3 4\ncpu0 1 2 3 4\n",
		"cpu 1 2 3 4\ncpu 1 2 3 4\ncpu0 1 2 3 4\n", "cpu 1 2 3 4\n"} {
		if _, err := parseProcStat([]byte(bad)); err == nil {
			t.Errorf("%q: parsed", bad)
		}
	}
}

func TestBusyCPUs(t *testing.T) {
	a := hostCPU{busy: 100, total: 1000, cpus: 16}
	b := hostCPU{busy: 400, total: 1400, cpus: 16}
	if got := busyCPUs(a, b); math.Abs(got-12) > 1e-9 {
		t.Fatalf("busy %v, want 12 of 16", got)
	}
	for _, tc := range [][2]hostCPU{{{}, b}, {a, {}}, {b, a}, {a, a}} {
		if got := busyCPUs(tc[0], tc[1]); got != 0 {
			t.Errorf("busyCPUs(%+v, %+v) = %v, want 0", tc[0], tc[1], got)
		}
	}
	if h := readHostCPU(); h.cpus == 0 || h.total == 0 {
		t.Fatalf("this host's /proc/stat: %+v", h)
	}
}

func FuzzParseProcStat(f *testing.F) {
	f.Add([]byte(procStat))
	f.Add([]byte("cpu 1 2 3 4\ncpu0 1 2 3 4\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseProcStat(b)
		if err == nil && (h.cpus == 0 || h.busy > h.total) {
			t.Fatalf("accepted %q as %+v", b, h)
		}
	})
}
