package blockstat

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestParseDiskstats(t *testing.T) {
	in := ` 254       0 vda 20413 4468 5270226 14940 6042 21048 5621800 4609 0 5752 20114 4532 24 4288440 564 4 0
   7       1 loop1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
short line
`
	ds, err := parseDiskstats(bufio.NewScanner(strings.NewReader(in)))
	if err != nil {
		t.Fatal(err)
	}
	vda := ds[Dev{Major: 254, Minor: 0}]
	if vda.Name != "vda" || vda.ReadIOs != 20413 || vda.ReadBytes() != 5270226*512 || vda.WriteIOs != 6042 || vda.WriteSectors != 5621800 {
		t.Fatalf("vda %+v", vda)
	}
	if len(ds) != 2 {
		t.Fatalf("%d devices", len(ds))
	}
	if _, err := parseDiskstats(bufio.NewScanner(strings.NewReader("1 x vda 1 2 3 4 5 6 7 8 9 10\n"))); err == nil {
		t.Fatal("want error for a non-numeric minor")
	}
}

func TestHistogram(t *testing.T) {
	for ns, b := range map[uint64]int{0: 0, 1: 0, 2: 1, 3: 1, 1023: 9, 1024: 10, 1 << 40: 40} {
		if got := bucketOf(ns); got != b {
			t.Errorf("bucketOf(%d) = %d, want %d", ns, got, b)
		}
	}
	var h Histogram
	h[10] = 90 // ~1 µs
	h[20] = 10 // ~1 ms
	if h.Count() != 100 || h.Quantile(0.5) != 2048 || h.Quantile(0.95) != 2<<20 || h.Quantile(1) != 2<<20 {
		t.Fatalf("count %d p50 %d p95 %d", h.Count(), h.Quantile(0.5), h.Quantile(0.95))
	}
}

func TestCPU(t *testing.T) {
	a, err := ProcessCPU()
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for i := 0; i < 1e7; i++ {
		x += i
	}
	_ = x
	b, _ := ProcessCPU()
	if d := b.Sub(a); d.Total() < 0 {
		t.Fatalf("negative CPU %v", d)
	}
	if (CPU{User: 1e9}).PerGiB(1<<29) != 2 {
		t.Fatal("PerGiB")
	}
}

// TestRealIO reads a file with O_DIRECT and checks that both counters saw at
// least those bytes on the file's disk.
func TestRealIO(t *testing.T) {
	dir := t.TempDir()
	if _, err := DiskOf(dir); err != nil {
		t.Skipf("temp dir not on a block device: %v", err)
	}
	path := filepath.Join(dir, "data")
	const size = 8 << 20
	buf := alignedBuf(t, size)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	fd, err := unix.Open(path, unix.O_CREAT|unix.O_RDWR|unix.O_DIRECT, 0o600)
	if err != nil {
		t.Skipf("O_DIRECT not supported here: %v", err)
	}
	defer unix.Close(fd)
	if n, err := unix.Pwrite(fd, buf, 0); err != nil || n != size {
		t.Fatalf("pwrite: %d %v", n, err)
	}
	if err := unix.Fsync(fd); err != nil {
		t.Fatal(err)
	}

	m := StartMeter(dir, true)
	if !m.EBPF() {
		t.Logf("eBPF not used: %s (diskstats alone)", m.ebpfReason)
	}
	const reads = 4
	for i := 0; i < reads; i++ {
		if n, err := unix.Pread(fd, buf, 0); err != nil || n != size {
			t.Fatalf("pread: %d %v", n, err)
		}
	}
	r := m.Stop()
	if r.DeviceErr != "" {
		t.Fatalf("device: %s", r.DeviceErr)
	}
	want := uint64(reads * size)
	if r.DiskReadBytes < want {
		t.Fatalf("diskstats read %d bytes, want ≥ %d", r.DiskReadBytes, want)
	}
	if r.EBPF {
		// eBPF has been seen to lose a few completions (8 KiB of 32 MiB here,
		// no skipped runs reported; cause not established): DeviceReadBytes
		// then takes diskstats (checked below), so this only asserts that
		// the program counts the reads at all.
		if r.EBPFReadBytes < want*9/10 {
			t.Fatalf("eBPF read %d bytes, want ≥ 90%% of %d", r.EBPFReadBytes, want)
		}
		if r.EBPFReadBytes < want {
			t.Logf("eBPF lost %d bytes of %d; DeviceReadBytes uses %s", want-r.EBPFReadBytes, want, r.Source())
		}
		if r.ReadLatency.Count() == 0 || r.EBPFReadIOs == 0 {
			t.Fatalf("no read latencies recorded: %+v", r)
		}
		t.Logf("%s: eBPF %d B in %d I/Os, diskstats %d B, read p50 ≤ %d ns", r.Name, r.EBPFReadBytes, r.EBPFReadIOs,
			r.DiskReadBytes, r.ReadLatency.Quantile(0.5))
	} else if os.Geteuid() == 0 && !strings.Contains(r.EBPFReason, "operation not permitted") {
		t.Logf("root but eBPF refused: %s", r.EBPFReason)
	}
	if r.DeviceReadBytes() < want {
		t.Fatal("DeviceReadBytes below what was read")
	}
}

func alignedBuf(t *testing.T, size int) []byte {
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	if uintptr(unsafe.Pointer(&b[0]))%4096 != 0 {
		t.Fatal("mmap not page aligned")
	}
	return b
}

// TestDeviceReadBytesCrossCheck: eBPF's count is used only while the
// diskstats cross-check passes; otherwise diskstats, and the source says why.
func TestDeviceReadBytesCrossCheck(t *testing.T) {
	for _, tc := range []struct {
		name   string
		r      Result
		want   uint64
		source string
	}{
		{"agree", Result{EBPF: true, Diskstats: true, EBPFReadBytes: 100, DiskReadBytes: 100}, 100, "eBPF block tracepoints"},
		{"ebpf later snapshot", Result{EBPF: true, Diskstats: true, EBPFReadBytes: 104, DiskReadBytes: 100}, 104, "eBPF block tracepoints"},
		{"ebpf lost events", Result{EBPF: true, Diskstats: true, EBPFReadBytes: 90, DiskReadBytes: 100}, 100, "events lost"},
		{"skipped runs", Result{EBPF: true, Diskstats: true, EBPFReadBytes: 100, DiskReadBytes: 100, EBPFMissed: 2}, 100, "skipped 2"},
		{"no diskstats", Result{EBPF: true, EBPFReadBytes: 90}, 90, "eBPF block tracepoints"},
		{"no ebpf", Result{Diskstats: true, DiskReadBytes: 100, EBPFReason: "refused"}, 100, "eBPF unavailable: refused"},
	} {
		if got := tc.r.DeviceReadBytes(); got != tc.want {
			t.Errorf("%s: DeviceReadBytes = %d, want %d", tc.name, got, tc.want)
		}
		if s := tc.r.Source(); !strings.Contains(s, tc.source) {
			t.Errorf("%s: Source = %q, want it to contain %q", tc.name, s, tc.source)
		}
	}
}

// TestMeterPaths: paths on one disk count it once; a path on no block device
// makes the whole measurement refuse (a sum missing a disk would be low).
func TestMeterPaths(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	d, err := DiskOf(a)
	if err != nil {
		t.Skipf("temp dir not on a block device: %v", err)
	}
	r := StartMeterPaths([]string{a, b, a}, false).Stop()
	if r.DeviceErr != "" || len(r.Devs) != 1 || r.Devs[0] != d || r.Dev != d || !r.Diskstats {
		t.Fatalf("same disk twice: %+v", r)
	}
	for _, paths := range [][]string{nil, {a, "/proc/self"}} {
		r := StartMeterPaths(paths, false).Stop()
		if r.DeviceErr == "" || r.Diskstats || r.Source() == "" {
			t.Fatalf("%q: want a device error, got %+v", paths, r)
		}
		t.Logf("%q: %s", paths, r.Source())
	}
}
