package objmap

import (
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// Prewrite writes the free, unwritten pool space and nothing else: committed
// runs and an open reservation's written objects keep their bytes, the free
// space is what it was, FIEMAP finds no unwritten bytes left but those of
// the runs' extents that no write of theirs covers (a spread run's header
// region in the files other than its home), and a store reopened over the
// prewritten pool has nothing else left to do. Skipped where the file
// system does not report extents.
func TestPrewrite(t *testing.T) {
	dirs := []string{filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")}
	o := testOpts(t, dirs...)
	o.CapacityBytes = 24 << 20
	m := mustOpen(t, o)
	if note := m.PrewriteNote(); note != "" {
		m.Close()
		t.Skipf("no extents here: %s", note)
	}
	left := m.PrewriteLeftBytes()
	if left != 24<<20 {
		m.Close()
		t.Fatalf("a fresh fallocated pool of 24 MiB: %d unwritten bytes known", left)
	}
	for _, d := range dirs {
		entries, _ := filepath.Glob(filepath.Join(d, "pool-*.dat"))
		for _, p := range entries {
			if n, ok := unwrittenExtents(t, p); !ok || n == 0 {
				t.Fatalf("%s: a fresh fallocated pool file with %d unwritten extents (reported: %v)", p, n, ok)
			}
		}
	}
	runs := save(t, m, 5)
	open, err := m.Allocate(3) // reserved and written, not committed
	if err != nil {
		t.Fatal(err)
	}
	var pending []CommitRequest
	for _, r := range open {
		pending = append(pending, writeRun(t, m, r))
	}
	free := m.Stats().FreeBytes
	var total int64
	for i := 0; ; i++ {
		n, err := m.Prewrite(3 << 20)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if n > 3<<20 || n%BlockBytes != 0 {
			t.Fatalf("step %d wrote %d bytes, want whole blocks within 3 MiB", i, n)
		}
		total += n
		if i > 100 {
			t.Fatal("Prewrite does not end")
		}
	}
	if got := m.PrewrittenBytes(); got != total || total != free {
		t.Errorf("prewrote %d bytes (counted %d), the free space was %d", total, got, free)
	}
	if m.PrewriteLeftBytes() != 0 || m.Stats().FreeBytes != free {
		t.Errorf("after prewriting: %d bytes left, %d free (was %d)", m.PrewriteLeftBytes(), m.Stats().FreeBytes, free)
	}
	for _, r := range runs {
		for l := 0; l < m.Geometry().Layers; l++ {
			readBack(t, m, r, l, r.Chunks())
		}
	}
	if err := m.Commit(pending); err != nil {
		t.Fatalf("committing the reservation written before the prewrite: %v", err)
	}
	for _, r := range open {
		info, _ := m.Lookup(r.ID)
		for l := 0; l < m.Geometry().Layers; l++ {
			readBack(t, m, info, l, info.Chunks())
		}
	}
	var all []Place
	for _, r := range runs {
		all = append(all, r.Place())
	}
	for _, r := range open {
		all = append(all, r.Place())
	}
	if m.Layout().Width() < 2 {
		t.Fatalf("width %d: the test wants runs spread over its 2 directories", m.Layout().Width())
	}
	want := unwrittenUnderRuns(m.Layout(), all)
	var wantTotal int64
	for i, f := range m.Files() {
		n, ok := unwrittenBytes(t, f.Path)
		if !ok || n != want[i] {
			t.Errorf("%s: %d unwritten bytes left, want %d, those of runs no write covers (extents reported: %v)", f.Path, n, want[i], ok)
		}
		wantTotal += want[i]
	}
	if len(m.Files()) != len(dirs) {
		t.Errorf("%d pool files in %d directories", len(m.Files()), len(dirs))
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Prewrite(1 << 20); !errors.Is(err, ErrClosed) {
		t.Errorf("Prewrite after Close: %v", err)
	}
	m = mustOpen(t, o)
	defer m.Close()
	if n := m.PrewriteLeftBytes(); n != wantTotal {
		t.Errorf("reopened over the prewritten pool: %d bytes left, want %d (under runs)", n, wantTotal)
	}
}

// unwrittenUnderRuns is, per pool file, the bytes of the runs' extents no
// write of theirs covers: a run's header region outside its home file and
// its empty object slots (Layout).
func unwrittenUnderRuns(lay Layout, runs []Place) map[int]int64 {
	out := map[int]int64{}
	for _, p := range runs {
		objs := map[int]int64{}
		for l := range lay.Geometry().Layers {
			loc, _ := lay.Where(p, l, 0)
			objs[loc.File]++
		}
		for _, f := range lay.RunFiles(p.File, nil) {
			n := lay.RunBytes(p.Chunks) - objs[f]*ObjectStride(lay.Geometry(), p.Chunks)
			if f == p.File {
				n -= HeaderRegionBytes(lay.Geometry(), p.Chunks)
			}
			out[f] += n
		}
	}
	return out
}

// A write-pool store and a read-only one have nothing to prewrite.
func TestPrewriteNothing(t *testing.T) {
	o := testOpts(t)
	o.WritePool = true
	m := mustOpen(t, o)
	if n := m.PrewriteLeftBytes(); n != 0 {
		t.Errorf("write pool: %d bytes to prewrite", n)
	}
	if n, err := m.Prewrite(1 << 20); n != 0 || err != nil {
		t.Errorf("write pool: Prewrite %d, %v", n, err)
	}
	if _, err := m.Prewrite(100); err == nil {
		t.Error("a prewrite of less than a block: no error")
	}
	m.Close()
	o.WritePool, o.ReadOnly = false, true
	m = mustOpen(t, o)
	defer m.Close()
	if _, err := m.Prewrite(1 << 20); !errors.Is(err, ErrReadOnly) {
		t.Errorf("read-only Prewrite: %v", err)
	}
}

// Prewrite racing saves and frees (go test -race): every run committed and
// not freed reads back whole, and the free space adds up.
func TestPrewriteConcurrent(t *testing.T) {
	o := testOpts(t, filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b"))
	o.CapacityBytes = 32 << 20
	m := mustOpen(t, o)
	defer m.Close()
	if note := m.PrewriteNote(); note != "" {
		t.Skipf("no extents here: %s", note)
	}
	done := make(chan error, 1)
	go func() {
		for {
			n, err := m.Prewrite(256 << 10)
			if err != nil || n == 0 {
				done <- err
				return
			}
		}
	}()
	var live []RunInfo
	for i := 0; i < 40; i++ {
		rs := save(t, m, 1+i%4)
		if i%3 == 0 {
			for _, r := range rs {
				if err := m.Free(r.ID); err != nil {
					t.Fatal(err)
				}
			}
			continue
		}
		live = append(live, rs...)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, r := range live {
		for l := 0; l < m.Geometry().Layers; l++ {
			readBack(t, m, r, l, r.Chunks())
		}
	}
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	var used int64
	for _, r := range live {
		used += m.Layout().Footprint(r.Chunks())
	}
	st := m.Stats()
	if st.FreeBytes+used+st.QuarantinedBytes != st.CapacityBytes || st.ReservedBytes != 0 {
		t.Errorf("free %d + runs %d + quarantined %d != capacity %d (reserved %d)", st.FreeBytes, used, st.QuarantinedBytes, st.CapacityBytes, st.ReservedBytes)
	}
}

// An allocation that needs the piece a prewrite is writing waits for it
// instead of failing for lack of space (the piece is out of the free space
// only while its write runs).
func TestAllocateWaitsForPrewrite(t *testing.T) {
	o := testOpts(t)
	m := mustOpen(t, o)
	defer m.Close()
	m.mu.Lock()
	free := m.alloc.freeBytes()
	fi, piece, ok := m.nextPrewrite(free) // the whole pool, as a write in progress holds it
	if ok {
		m.pre.inflight++
	}
	m.mu.Unlock()
	if !ok {
		t.Skipf("nothing unwritten to prewrite here (%s)", m.PrewriteNote())
	}
	release := func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.pre.inflight == 0 {
			return
		}
		if err := m.alloc.free(fi, piece); err != nil {
			t.Error(err)
		}
		m.pre.inflight--
		m.prewriteDone.Broadcast()
	}
	defer release() // before Close (deferred earlier), which waits for it
	chunks := chunksThatFit1(m.Geometry(), free)
	got := make(chan int, 1)
	go func() {
		res, err := m.Allocate(chunks)
		n := 0
		for _, r := range res {
			n += r.Chunks
		}
		if err != nil {
			n = -1
		}
		got <- n
	}()
	select {
	case n := <-got:
		t.Fatalf("Allocate returned %d chunks while the prewrite held the pool", n)
	case <-time.After(100 * time.Millisecond):
	}
	release()
	if n := <-got; n != chunks {
		t.Fatalf("after the prewrite: %d of %d chunks allocated", n, chunks)
	}
}
