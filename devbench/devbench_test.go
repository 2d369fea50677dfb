package devbench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"4k", 4096, true}, {"4K", 4096, true}, {"4KiB", 4096, true}, {"1m", 1 << 20, true},
		{"1GiB", 1 << 30, true}, {"2g", 2 << 30, true}, {"65536", 65536, true}, {"1MB", 1 << 20, true},
		{"", 0, false}, {"k", 0, false}, {"-4k", 0, false}, {"4x", 0, false}, {"1.5m", 0, false}, {"0", 0, false},
	} {
		got, err := ParseBytes(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestValidate(t *testing.T) {
	base := DefaultConfig()
	base.Path = "/tmp"
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		msg  string
	}{
		{"no path", func(c *Config) { c.Path = "" }, "no path"},
		{"engine", func(c *Config) { c.Engines = []string{"spdk"} }, "unknown engine"},
		{"op", func(c *Config) { c.Ops = []string{"randrw"} }, "unknown op"},
		{"bs", func(c *Config) { c.BlockSizes = []int{1000} }, "block size"},
		{"qd", func(c *Config) { c.QueueDepths = []int{0} }, "queue depth"},
		{"runtime", func(c *Config) { c.Runtime = -time.Second }, "runtime"},
		{"size", func(c *Config) { c.SizeBytes = 4096 }, "size"},
	} {
		c := base
		tc.mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want an error about %q", tc.name, err, tc.msg)
		}
	}
}

// TestRunSmallGrid runs every engine and op for a few milliseconds on a
// test file in a temp dir: rows are complete, the file is removed, and the
// JSON carries exactly the contract's field names.
func TestRunSmallGrid(t *testing.T) {
	dir := t.TempDir()
	var progress int
	rows, err := Run(context.Background(), Config{
		Path: dir, BlockSizes: []int{4096, 65536}, QueueDepths: []int{1, 4},
		Engines: Engines, Ops: Ops, Runtime: 20 * time.Millisecond, SizeBytes: 4 << 20,
		Progress: func(done, total int, s Spec, r *Row) { progress++ },
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := len(Engines) * len(Ops) * 2 * 2; len(rows) != want || progress != 2*want {
		t.Fatalf("%d rows, %d progress calls; want %d rows", len(rows), progress, want)
	}
	for _, r := range rows {
		if r.Ops == 0 || r.IOPS <= 0 || r.BytesPerS != r.IOPS*float64(r.BlockBytes) && r.BytesPerS <= 0 || r.P50Us <= 0 || r.P99Us < r.P50Us {
			t.Fatalf("incomplete row %+v", r)
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 0 {
		t.Fatalf("test file left behind: %v", ents)
	}
	b, err := json.Marshal(rows[0])
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	json.Unmarshal(b, &m)
	want := []string{"engine", "op", "block_bytes", "queue_depth", "iops", "bytes_per_s", "p50_us", "p99_us", "cpu_s_per_gib", "buffer_bytes"}
	delete(m, "buffer_huge") // present only when the buffer was on huge pages
	if len(m) != len(want) {
		t.Fatalf("JSON fields %v, want exactly %v", m, want)
	}
	for _, k := range want {
		if _, ok := m[k]; !ok {
			t.Fatalf("JSON lacks %q: %s", k, b)
		}
	}
}

func TestKeepAndReuse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dev.dat")
	cfg := Config{Path: path, BlockSizes: []int{4096}, QueueDepths: []int{2}, Engines: []string{"uring"},
		Ops: []string{"seqread"}, Runtime: 10 * time.Millisecond, SizeBytes: 2 << 20, Keep: true}
	if _, err := Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Size() != 2<<20 {
		t.Fatalf("kept file: %v %v", st, err)
	}
	// An existing, fully written file is reused and not removed.
	cfg.Keep = false
	if _, err := Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("an existing file was removed: %v", err)
	}
	// Too small for the requested size: a clear error.
	cfg.SizeBytes = 8 << 20
	if _, err := Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "less than --size") {
		t.Fatalf("want a size error, got %v", err)
	}
}

func TestBadPaths(t *testing.T) {
	for _, tc := range []struct{ path, msg string }{
		{"/nonexistent-dir/x/y", "no such file"},
		{"/dev/null", "neither a regular file"},
	} {
		_, err := Run(context.Background(), Config{Path: tc.path, BlockSizes: []int{4096}, QueueDepths: []int{1},
			Engines: []string{"uring"}, Ops: []string{"randread"}, Runtime: time.Millisecond, SizeBytes: 1 << 20})
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want error containing %q", tc.path, err, tc.msg)
		}
	}
}

func TestCeiling(t *testing.T) {
	if testing.Short() {
		t.Skip("2 s measurement")
	}
	bps, row, err := Ceiling(context.Background(), t.TempDir(), 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	if bps <= 0 || row.Engine != "uring" || row.BlockBytes != 1<<20 || row.QueueDepth != 32 || row.BufferBytes != 32<<20 {
		t.Fatalf("ceiling %v row %+v", bps, row)
	}
	// Reads rotating over a larger destination: it is allocated, and the
	// data still all arrives (a short or failed read fails the row).
	bps, row, err = CeilingInto(context.Background(), t.TempDir(), 64<<20, 96<<20)
	if err != nil {
		t.Fatal(err)
	}
	if bps <= 0 || row.BufferBytes != 96<<20 {
		t.Fatalf("ceiling into 96 MiB: %v row %+v", bps, row)
	}
}

func TestBufferBytesValidate(t *testing.T) {
	for _, tc := range []struct {
		bytes int64
		ok    bool
	}{{0, true}, {1 << 30, true}, {-1, false}, {1<<30 + 1, false}} {
		c := Config{Path: "/x", BufferBytes: tc.bytes}
		c.fill()
		if err := c.Validate(); (err == nil) != tc.ok {
			t.Errorf("BufferBytes %d: %v", tc.bytes, err)
		}
	}
}

func FuzzParseBytes(f *testing.F) {
	for _, s := range []string{"4k", "1MiB", "65536", "2g", "", "9223372036854775807k", "-1", "1t"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseBytes(s)
		if err == nil && v <= 0 {
			t.Fatalf("ParseBytes(%q) = %d without error", s, v)
		}
		if err == nil {
			// What FormatBytes prints parses back to the same value.
			if w, err := ParseBytes(FormatBytes(v)); err != nil || w != v {
				t.Fatalf("round trip of %d: %d %v", v, w, err)
			}
		}
	})
}

// CeilingStriped reads exactly each device's budget, starts the devices
// together, and divides all bytes by the slowest device's time.
func TestCeilingStriped(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir()}
	sizes := []int64{16 << 20, 24 << 20}
	reads := []int64{8 << 20, 40<<20 + 1} // the second one rounds up to 41 reads
	st, err := CeilingStriped(context.Background(), dirs, sizes, reads, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Devices) != 2 || st.Devices[0].Ops != 8 || st.Devices[1].Ops != 41 {
		t.Fatalf("reads per device: %+v", st.Devices)
	}
	slow := st.Devices[st.Slowest]
	for i, d := range st.Devices {
		if d.Seconds <= 0 || d.Seconds > slow.Seconds {
			t.Errorf("device %d took %v s, the slowest (%d) %v s", i, d.Seconds, st.Slowest, slow.Seconds)
		}
	}
	want := float64(49<<20) / slow.Seconds
	if st.Seconds != slow.Seconds || st.BytesPerS < want*0.999 || st.BytesPerS > want*1.001 {
		t.Errorf("aggregate %v over %v s, want %v", st.BytesPerS, st.Seconds, want)
	}
	if st.BytesPerS > st.SumBytesPerS*1.0001 {
		t.Errorf("aggregate %v above the sum of the devices' rates %v", st.BytesPerS, st.SumBytesPerS)
	}
}

// A device that fails (here before its clock could start) is the result's
// error and does not hold the others at the start barrier.
func TestCeilingStripedFailure(t *testing.T) {
	for _, tc := range []struct {
		name  string
		paths []string
		reads []int64
		msg   string
	}{
		{"missing path", []string{t.TempDir(), "/nonexistent-dir/x/y"}, []int64{4 << 20, 4 << 20}, "no such file"},
		{"nothing to read", []string{t.TempDir(), t.TempDir()}, []int64{4 << 20, 1000}, "less than one 1 MiB read"},
		{"lengths", []string{t.TempDir()}, []int64{4 << 20, 4 << 20}, "1 paths, 2 sizes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sizes := make([]int64, len(tc.reads))
			for i := range sizes {
				sizes[i] = 8 << 20
			}
			done := make(chan error, 1)
			go func() {
				_, err := CeilingStriped(context.Background(), tc.paths, sizes, tc.reads, 0)
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), tc.msg) {
					t.Fatalf("got %v, want an error containing %q", err, tc.msg)
				}
			case <-time.After(60 * time.Second):
				t.Fatal("CeilingStriped hung at its start barrier")
			}
		})
	}
}

// A ceiling over a block device reads only its first sizeBytes (the data a
// benchmark wrote there), a grid run the whole device; and neither reads a
// loop device's unwritten blocks. Needs loop devices (root, losetup):
// skipped where none can be set up.
func TestCeilingTargetWithinSize(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to set up a loop device")
	}
	dir := t.TempDir()
	loop := func(name string, written int64) string {
		img := filepath.Join(dir, name)
		f, err := os.Create(img)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(bytes.Repeat([]byte{0xa5}, int(written))); err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(64 << 20); err != nil {
			t.Fatal(err)
		}
		f.Close()
		out, err := exec.Command("losetup", "--find", "--show", img).Output()
		if err != nil {
			t.Skipf("no loop device here (losetup: %v)", err)
		}
		dev := strings.TrimSpace(string(out))
		t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
		return dev
	}
	full, part := loop("full.img", 64<<20), loop("part.img", 16<<20)
	sparse := true
	if f, err := os.Open(filepath.Join(dir, "part.img")); err == nil {
		h, err := unix.Seek(int(f.Fd()), 0, unix.SEEK_HOLE)
		sparse = err == nil && h < 64<<20
		f.Close()
	}
	for _, tc := range []struct {
		dev        string
		size, want int64
		holes      bool
	}{
		{full, 8 << 20, 8 << 20, false},
		{full, 8<<20 + 4096, 8 << 20, false},
		{full, 1 << 30, 64 << 20, false},
		{part, 16 << 20, 16 << 20, false},
		{part, 32 << 20, 0, sparse},
	} {
		tg, err := openCeilingTarget(context.Background(), tc.dev, tc.size, false)
		if tc.holes {
			if !errors.Is(err, errHoles) {
				t.Errorf("ceiling over %d bytes of a device written in its first 16 MiB: %v, want errHoles", tc.size, err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if tg.sizeBytes != tc.want {
			t.Errorf("ceiling target of a 64 MiB device with size %d covers %d bytes, want %d", tc.size, tg.sizeBytes, tc.want)
		}
		tg.close()
	}
	tg, err := openTarget(context.Background(), full, 8<<20, false, false, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.close()
	if tg.sizeBytes != 64<<20 {
		t.Errorf("grid target of a 64 MiB device covers %d bytes, want the whole device", tg.sizeBytes)
	}
	if sparse {
		// A written file named like the sparse loop device is a file: the
		// device number, not the name, finds a loop's backing file.
		named := filepath.Join(t.TempDir(), filepath.Base(part))
		if err := os.WriteFile(named, bytes.Repeat([]byte{0x5a}, 32<<20), 0o644); err != nil {
			t.Fatal(err)
		}
		switch tg, err := openCeilingTarget(context.Background(), named, 32<<20, false); {
		case errors.Is(err, unix.EINVAL):
			t.Logf("%s: no O_DIRECT on this file system, the file named like a loop device is not checked", named)
		case err != nil:
			t.Errorf("a written file named %s like the sparse loop device: %v", filepath.Base(part), err)
		default:
			tg.close()
		}
		_, err := Run(context.Background(), Config{Path: part, BlockSizes: []int{1 << 20}, QueueDepths: []int{1},
			Engines: []string{"uring"}, Ops: []string{"randread"}, Runtime: time.Millisecond, SizeBytes: 1 << 20})
		if !errors.Is(err, errHoles) || !strings.Contains(err.Error(), "part.img") {
			t.Errorf("grid over a partly written loop device: %v, want errHoles naming its file", err)
		}
		rows, err := Run(context.Background(), Config{Path: part, BlockSizes: []int{1 << 20}, QueueDepths: []int{1},
			Engines: []string{"uring"}, Ops: []string{"randread"}, Runtime: time.Millisecond, SizeBytes: 1 << 20, AllowHoles: true})
		if err != nil || len(rows) != 1 {
			t.Errorf("grid over a partly written loop device, holes allowed: %v %v", rows, err)
		}
	}
}

// WriteCeilingFile leaves a whole-MiB file of real blocks that the ceilings
// then read as they are (not written again, not removed), and refuses a path
// that exists.
func TestWriteCeilingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ceiling.dat")
	err := WriteCeilingFile(context.Background(), path, 3<<20+1)
	if errors.Is(err, unix.EINVAL) {
		t.Skipf("no O_DIRECT here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != 4<<20 {
		t.Fatalf("size %d, want 4 MiB (rounded up to whole MiB)", st.Size())
	}
	mtime := st.ModTime()
	if _, _, err := CeilingInto(context.Background(), path, 4<<20, 0); err != nil {
		t.Fatal(err)
	}
	st2, err := os.Stat(path)
	if err != nil {
		t.Fatalf("the ceiling removed the file it did not write: %v", err)
	}
	if !st2.ModTime().Equal(mtime) {
		t.Fatal("the ceiling wrote the file again")
	}
	if err := WriteCeilingFile(context.Background(), path, 1<<20); err == nil {
		t.Fatal("an existing path was overwritten")
	}
}

// TestSizeBeyondFreeSpace: a test file larger than its file system's free
// space is refused before anything is written, naming both sizes.
func TestSizeBeyondFreeSpace(t *testing.T) {
	dir := t.TempDir()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	size := free + 64<<20
	cfg := DefaultConfig()
	cfg.Path, cfg.SizeBytes = dir, size
	cfg.BlockSizes, cfg.QueueDepths, cfg.Engines, cfg.Ops = []int{4096}, []int{1}, []string{"pread"}, []string{"randread"}
	_, err := Run(context.Background(), cfg)
	if !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), fmt.Sprint(wholeMiB(size))) || !strings.Contains(err.Error(), "free in "+dir) {
		t.Fatalf("err %v, want ErrNoRoom naming %d bytes and the free space of %s", err, wholeMiB(size), dir)
	}
	if e, _ := os.ReadDir(dir); len(e) != 0 {
		t.Fatalf("%d files left in %s", len(e), dir)
	}
	if err := WriteCeilingFile(context.Background(), filepath.Join(dir, "ceiling.dat"), size); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("ceiling file: %v, want ErrNoRoom", err)
	}
}

// CeilingStripedWrite overwrites exactly each device's budget of existing
// written files (wrapping within sizeBytes), starts the devices together,
// divides all bytes by the slowest device's time to its sync, and refuses a
// sparse target (writes over holes allocate: not the ceiling of overwrites).
func TestCeilingStripedWrite(t *testing.T) {
	ctx := context.Background()
	dirs := []string{t.TempDir(), t.TempDir()}
	sizes := []int64{8 << 20, 16 << 20}
	writes := []int64{8 << 20, 24<<20 + 1} // the second wraps and rounds up to 25 writes
	var files []string
	for i, d := range dirs {
		f := filepath.Join(d, "ceil.dat")
		if err := WriteCeilingFile(ctx, f, sizes[i]); err != nil {
			if errors.Is(err, unix.EINVAL) {
				t.Skipf("%s: no O_DIRECT here", d)
			}
			t.Fatal(err)
		}
		files = append(files, f)
	}
	// The writes carry the fill's own pattern: the mtime says they happened.
	past := time.Now().Add(-time.Hour)
	if err := os.Chtimes(files[0], past, past); err != nil {
		t.Fatal(err)
	}
	st, err := CeilingStripedWrite(ctx, files, sizes, writes, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Devices) != 2 || st.Devices[0].Ops != 8 || st.Devices[1].Ops != 25 {
		t.Fatalf("writes per device: %+v", st.Devices)
	}
	for i, d := range st.Devices {
		if d.Op != "seqwrite" || d.Seconds <= 0 || d.Seconds > st.Seconds {
			t.Errorf("device %d: %s over %v s, the slowest %v s", i, d.Op, d.Seconds, st.Seconds)
		}
	}
	if want := float64(33<<20) / st.Seconds; st.BytesPerS < want*0.999 || st.BytesPerS > want*1.001 {
		t.Errorf("aggregate %v, want %v", st.BytesPerS, want)
	}
	if fi, err := os.Stat(files[0]); err != nil || !fi.ModTime().After(past.Add(time.Minute)) || fi.Size() != sizes[0] {
		t.Errorf("the file was not overwritten in place: %v, %v", fi, err)
	}
	sparse := filepath.Join(dirs[0], "sparse.dat")
	if err := os.WriteFile(sparse, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(sparse, 8<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := CeilingStripedWrite(ctx, []string{sparse}, []int64{8 << 20}, []int64{8 << 20}, 0); err == nil || !strings.Contains(err.Error(), "sparse") {
		t.Errorf("a sparse target: %v, want a refusal that says it is sparse", err)
	}
	if _, err := CeilingStripedWrite(ctx, files[:1], sizes[:1], []int64{1000}, 0); err == nil || !strings.Contains(err.Error(), "less than one 1 MiB write") {
		t.Errorf("a budget under one write: %v", err)
	}
}
