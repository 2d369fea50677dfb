package objmap

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestHeaderEIO injects an EIO on one run's header read at Open: fsck
// (read-only) names the run, file and offset; a writable Open does not
// serve the run but keeps it (no free journaled), so the Open after the
// fault serves it again, bit for bit.
func TestHeaderEIO(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s")
	m := mustOpen(t, testOpts(t, dir))
	runs := append(save(t, m, 2), save(t, m, 3)...)
	must(t, m.Close())
	bad := runs[1]
	testHookPread = func(fd, n int, off int64) error {
		if off == bad.Offset && n == int(HeaderRegionBytes(tinyGeom, bad.Chunks())) {
			return unix.EIO
		}
		return nil
	}
	defer func() { testHookPread = nil }()

	ro := mustOpen(t, Options{Dirs: []string{dir}, ReadOnly: true})
	rep := ro.Recovery()
	must(t, ro.Close())
	if rep.Clean() || rep.Unreadable != 1 || rep.Dropped != 0 || rep.UnreadableRuns[0].Run != bad.ID ||
		rep.UnreadableRuns[0].Offset != bad.Offset || !strings.Contains(rep.UnreadableRuns[0].Reason, "input/output error") {
		t.Fatalf("read-only report: %v", rep)
	}
	if !strings.Contains(rep.String(), "unreadable run 2 (file 0 offset") {
		t.Fatalf("report text: %s", rep)
	}
	m = mustOpen(t, testOpts(t, dir))
	if _, ok := m.Lookup(bad.ID); ok {
		t.Fatal("a run whose header could not be read is served")
	}
	if r := m.Recovery(); r.Unreadable != 1 || r.Recovered != 1 {
		t.Fatalf("writable report: %v", r)
	}
	must(t, m.Close())
	testHookPread = nil
	m = mustOpen(t, testOpts(t, dir))
	defer m.Close()
	r, ok := m.Lookup(bad.ID)
	if !ok || !m.Recovery().Clean() {
		t.Fatalf("the run did not come back once the header was readable: %v", m.Recovery())
	}
	readBack(t, m, r, 1, r.Chunks())
}

// TestSharedLock: read-only opens share the lock and write nothing (not
// even a LOCK file where there is none); a writer is refused while one
// holds it, and a read-only open is refused while a writer holds it.
func TestSharedLock(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s")
	m := mustOpen(t, testOpts(t, dir))
	save(t, m, 2)
	must(t, m.Close())

	a := mustOpen(t, Options{Dirs: []string{dir}, ReadOnly: true})
	b := mustOpen(t, Options{Dirs: []string{dir}, ReadOnly: true})
	_, err := Open(testOpts(t, dir))
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "read-only checker") {
		t.Fatalf("writer while fsck holds the store: %v", err)
	}
	must(t, a.Close())
	must(t, b.Close())

	// No LOCK file (a copy on read-only media): nothing is created.
	must(t, os.Remove(filepath.Join(dir, lockName)))
	before := dirState(t, dir)
	c := mustOpen(t, Options{Dirs: []string{dir}, ReadOnly: true})
	if c.Recovery().Recovered != 1 {
		t.Fatalf("report %v", c.Recovery())
	}
	must(t, c.Close())
	if after := dirState(t, dir); after != before {
		t.Fatalf("read-only open changed the directory:\n%s\n%s", before, after)
	}
}

// smallTmpfs mounts a tmpfs of sizeBytes (root only) and unmounts it in
// Cleanup; it skips the test where mounting is impossible.
func smallTmpfs(t *testing.T, sizeBytes int64) string {
	t.Helper()
	mnt := filepath.Join(t.TempDir(), "mnt")
	must(t, os.Mkdir(mnt, 0o700))
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size="+itoa(sizeBytes)); err != nil {
		t.Skipf("cannot mount a tmpfs (needs root): %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(mnt, 0) })
	return mnt
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// TestFailedOpenLeavesNothing fails store creation with ENOSPC while the
// pool is preallocated (a small tmpfs) and while it writes
// the journal after the pool was created: each time the directory is left as it was
// found, and the space is free again.
func TestFailedOpenLeavesNothing(t *testing.T) {
	mnt := smallTmpfs(t, 4<<20)
	var fs0 unix.Statfs_t
	must(t, unix.Statfs(mnt, &fs0))
	cases := []struct {
		name     string
		dir      string // relative to mnt
		preexist bool
		opts     func(o *Options)
	}{
		{"ENOSPC, new nested directory", "a/b/store", false, func(o *Options) { o.CapacityBytes = 64 << 20; o.Buffered = true }},
		{"ENOSPC, existing directory with a file", "keep", true, func(o *Options) { o.CapacityBytes = 64 << 20; o.Buffered = true }},
		{"ENOSPC after the pool, on the journal or manifest", "tight", false, func(o *Options) { o.CapacityBytes = 4<<20 - 4096; o.Buffered = true }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(mnt, tc.dir)
			if tc.preexist {
				must(t, os.MkdirAll(dir, 0o700))
				must(t, os.WriteFile(filepath.Join(dir, "mine"), []byte("x"), 0o600))
			}
			before := treeState(t, mnt)
			o := Options{Dirs: []string{dir}, Geometry: tinyGeom}
			tc.opts(&o)
			if _, err := Open(o); err == nil {
				t.Fatal("open succeeded")
			} else {
				t.Log(err)
			}
			if after := treeState(t, mnt); after != before {
				t.Fatalf("failed open left:\n%s\nwas:\n%s", after, before)
			}
			if tc.preexist {
				ents, _ := os.ReadDir(dir)
				if len(ents) != 1 || ents[0].Name() != "mine" {
					t.Fatalf("existing directory holds %v", ents)
				}
				must(t, os.RemoveAll(dir))
			}
			var fs1 unix.Statfs_t
			must(t, unix.Statfs(mnt, &fs1))
			if fs1.Bfree != fs0.Bfree {
				t.Fatalf("%d blocks free after the failed open, %d before", fs1.Bfree, fs0.Bfree)
			}
		})
	}
}

// TestJournalTailVerdicts: only a torn last group is a silent drop.
func TestJournalTailVerdicts(t *testing.T) {
	rec, _ := AppendRecord(nil, &Record{Type: RecCommit, Run: RunInfo{ID: 50, Generation: 1, Length: runBytes1(tinyGeom, 1), Chain: []uint64{1}}})
	free, _ := AppendRecord(nil, &Record{Type: RecFree, ID: 77})
	cases := []struct {
		name   string
		mutate func(b []byte) []byte
		damage string // "" for a silent torn tail
		tail   int64
	}{
		{"last record cut short", func(b []byte) []byte { return append(b, rec[:len(rec)-3]...) }, "", int64(len(rec) - 3)},
		{"zeros after the last record", func(b []byte) []byte { return append(b, make([]byte, 3000)...) }, "", 3000},
		{"last record cut, then zeros", func(b []byte) []byte { return append(append(b, rec[:9]...), make([]byte, 100)...) }, "", 109},
		{"a record flipped, valid ones after", func(b []byte) []byte {
			b = append(b, rec...)
			b = append(b, free...)
			b[len(b)-len(free)-len(rec)+12] ^= 1
			return b
		}, "a valid free record follows", 0},
		{"zeros, then a valid record", func(b []byte) []byte { return append(append(b, make([]byte, 64)...), free...) }, "a valid free record follows", 0},
		{"a tail longer than one group", func(b []byte) []byte { return append(b, make([]byte, DefaultMaxGroupBytes+1)...) }, "more than one group commit", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "s")
			m := mustOpen(t, testOpts(t, dir))
			save(t, m, 1)
			must(t, m.Close())
			p := filepath.Join(dir, segmentName(1))
			b, err := os.ReadFile(p)
			must(t, err)
			must(t, os.WriteFile(p, tc.mutate(b), 0o600))
			ro := mustOpen(t, Options{Dirs: []string{dir}, ReadOnly: true})
			defer ro.Close()
			rep := ro.Recovery()
			if tc.damage == "" && (rep.JournalDamage != "" || rep.JournalTailBytes != tc.tail || !rep.Clean()) ||
				tc.damage != "" && (!strings.Contains(rep.JournalDamage, tc.damage) || !rep.Rebuilt || rep.Clean()) {
				t.Fatalf("report: %v", rep)
			}
			if rep.Recovered != 1 {
				t.Fatalf("the committed run is not served: %v", rep)
			}
		})
	}
}

// treeState lists every path under root with its size (not times: a
// directory's own changes as files come and go).
func treeState(t *testing.T, root string) string {
	t.Helper()
	var sb strings.Builder
	must(t, filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if !info.IsDir() {
			sb.WriteString(p + " " + itoa(info.Size()) + "\n")
		} else {
			sb.WriteString(p + "/\n")
		}
		return nil
	}))
	return sb.String()
}
