package objmap

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// injectJournal makes the next times journal calls of kind op fail with
// errno (writes of n > 0 bytes after half of them reached the file when
// short is set; syncs are calls with n = 0), and reports how many failed.
func injectJournal(t *testing.T, op string, sync, short bool, errno error, times int) *int {
	t.Helper()
	fired := 0
	testHookJournalIO = func(o string, n int) (int, error) {
		if o != op || (n == 0) != sync || fired >= times {
			return 0, nil
		}
		fired++
		if short {
			return n / 2, errno
		}
		return 0, errno
	}
	t.Cleanup(func() { testHookJournalIO = nil })
	return &fired
}

// TestJournalNoSpace: a journal group, checkpoint or segment the file
// system has no room for costs the commits made meanwhile and nothing
// else. A group is undone (the segment truncated back to its last durable
// record, commits abandoned with ENOSPC and their space free again, frees
// and trims queued again); a checkpoint or segment is retried by a later
// group, leaving no temp file. Commits succeed again once space is back,
// and after a crash or a Close the journal replays without damage: exactly
// the acknowledged runs, with their trims, and no freed one.
func TestJournalNoSpace(t *testing.T) {
	for _, tc := range []noSpaceCase{
		{name: "append cut short", op: "append", short: true, errno: unix.ENOSPC, segment: 1 << 20, groups: true},
		{name: "append nothing written", op: "append", errno: unix.EDQUOT, segment: 1 << 20, groups: true},
		{name: "append sync", op: "append", sync: true, errno: unix.ENOSPC, segment: 1 << 20, groups: true},
		{name: "checkpoint", op: "checkpoint", short: true, errno: unix.ENOSPC, segment: 1024, checkpoints: true},
		{name: "checkpoint sync", op: "checkpoint", sync: true, errno: unix.ENOSPC, segment: 1024, checkpoints: true},
		// The checkpoint is in place, its segment not: the groups after it
		// create the segment first, and fail (undone) while they cannot.
		{name: "next segment", op: "segment", errno: unix.ENOSPC, segment: 1024, groups: true, checkpoints: true},
		{name: "append EIO", op: "append", short: true, errno: unix.EIO, segment: 1 << 20, sticky: true},
	} {
		for _, end := range []string{"close", "crash", "crash at once"} {
			t.Run(tc.name+"/"+end, func(t *testing.T) { noSpaceOnce(t, tc, end) })
		}
	}
}

// noSpaceCase is one fault of TestJournalNoSpace: the calls it fails
// (injectJournal's op, sync, short, errno), the segment bound, and what
// it must cost: undone groups (commits fail), checkpoints retried, or a
// journal failed closed.
type noSpaceCase struct {
	name                        string
	op                          string
	sync, short                 bool
	errno                       error
	segment                     int64
	groups, checkpoints, sticky bool
}

// noSpaceOnce runs tc, then ends the store as end says: a Close or a crash
// after commits that succeed again, or a crash right after the fault.
func noSpaceOnce(t *testing.T, tc noSpaceCase, end string) {
	op, sync, short, errno, segment, sticky := tc.op, tc.sync, tc.short, tc.errno, tc.segment, tc.sticky
	rng := rand.New(rand.NewPCG(uint64(segment), 3))
	dir := filepath.Join(t.TempDir(), "s")
	o := testOpts(t, dir)
	o.SegmentBytes = segment
	m := mustOpen(t, o)
	acked := map[RunID]int{} // run -> Kept
	commit := func() (RunID, error) {
		res, err := m.Allocate(1 + rng.IntN(3))
		if err != nil {
			return 0, err
		}
		req := writeRun(t, m, res[0])
		err = m.Commit([]CommitRequest{req})
		if err == nil {
			acked[res[0].ID] = res[0].Chunks
		}
		return res[0].ID, err
	}
	for range 6 {
		if _, err := commit(); err != nil {
			t.Fatal(err)
		}
	}
	// Queued when the fault fires: a free and a trim, which must survive it
	// (a crash before any group is written again may lose them: the run
	// then comes back whole, as after any crash before a record is durable).
	ids := sortedKeys(acked)
	freed, trimmed, untrimmed := ids[0], RunID(0), 0
	if err := m.Free(freed); err != nil {
		t.Fatal(err)
	}
	untrimmedFreed := acked[freed]
	delete(acked, freed)
	for _, id := range ids[1:] {
		if acked[id] > 1 {
			if err := m.Trim(id, 1); err != nil {
				t.Fatal(err)
			}
			trimmed, untrimmed, acked[id] = id, acked[id], 1
			break
		}
	}
	const times = 3
	fired := injectJournal(t, op, sync, short, errno, times)
	var failed []RunID
	for i := 0; i < 60 && *fired < times; i++ {
		id, err := commit()
		switch {
		case err != nil && !errors.Is(err, errno):
			t.Fatalf("commit failed with %v, want %v", err, errno)
		case err != nil && sticky:
			*fired = times
		case err != nil:
			failed = append(failed, id)
		}
	}
	if *fired < times {
		t.Fatalf("the fault fired %d times of %d", *fired, times)
	}
	st := m.Stats()
	if sticky {
		if _, err := m.Allocate(1); err == nil {
			t.Fatal("the journal did not fail closed after an I/O error")
		}
	}
	if (len(failed) > 0) != tc.groups || (st.JournalFailures > 0) != tc.groups || (st.AbandonedCommits > 0) != tc.groups {
		t.Fatalf("%d commits failed (want some: %v), stats %+v", len(failed), tc.groups, st)
	}
	if (st.CheckpointFailures > 0) != tc.checkpoints || (st.CheckpointError != "") != tc.checkpoints {
		t.Fatalf("checkpoint failures (want some: %v), stats %+v", tc.checkpoints, st)
	}
	for _, id := range failed {
		if _, ok := m.Lookup(id); ok {
			t.Fatalf("run %d served after its commit failed", id)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, checkpointTmpName)); !os.IsNotExist(err) {
		t.Fatalf("%s left behind: %v", checkpointTmpName, err)
	}
	if !sticky && end != "crash at once" {
		// Space is back: commits succeed, the journal is healthy, and the
		// checkpoint that failed is written by a later group.
		for range 30 {
			if _, err := commit(); err != nil {
				t.Fatalf("commit after the fault: %v", err)
			}
		}
		if err := m.Failing(); err != nil {
			t.Fatalf("still failing after successful commits: %v", err)
		}
		if st := m.Stats(); segment < 1<<20 && st.Checkpoints == 0 {
			t.Fatalf("no checkpoint written after the fault: %+v", st)
		}
		checkSpace(t, m)
	}
	if end != "close" {
		m.closeFiles()
	} else if err := m.Close(); err != nil && !sticky {
		t.Fatal(err)
	}
	testHookJournalIO = nil
	m = mustOpen(t, o)
	defer m.Close()
	rep := m.Recovery()
	if rep.JournalDamage != "" || rep.Rebuilt || rep.Dropped != 0 {
		t.Fatalf("recovery: %v", rep)
	}
	got := map[RunID]int{}
	m.Runs(func(r RunInfo) bool { got[r.ID] = r.Kept; return true })
	if end == "crash at once" && !sticky {
		if k, ok := got[freed]; ok && k == untrimmedFreed {
			delete(got, freed) // its free was lost with the crash
		}
		if got[trimmed] == untrimmed {
			got[trimmed] = 1 // so was the trim
		}
	}
	for id, k := range acked {
		if got[id] != k {
			t.Errorf("acknowledged run %d: keeps %d chunks after reopen, want %d", id, got[id], k)
		}
	}
	for id := range got {
		if _, ok := acked[id]; !ok && !sticky {
			t.Errorf("run %d served after reopen, never acknowledged (or freed)", id)
		}
	}
	if segs, _ := filepath.Glob(filepath.Join(dir, "journal-*.log")); len(segs) != 1 {
		t.Fatalf("segments after reopen: %v", segs)
	}
	if c, err := m.Check(); err != nil || c.Corrupt != 0 {
		t.Fatalf("check: %v %v", c, err)
	}
	checkSpace(t, m)
}

// checkSpace asserts that the pool's space is all accounted for: free,
// quarantined, reserved or held by a run.
func checkSpace(t *testing.T, m *Map) {
	t.Helper()
	var live int64
	m.mu.Lock()
	for _, e := range m.runs {
		live += e.info.Length
	}
	m.mu.Unlock()
	s := m.Stats()
	if s.FreeBytes+s.QuarantinedBytes+s.ReservedBytes+live != s.CapacityBytes {
		t.Fatalf("free %d + quarantined %d + reserved %d + runs %d != capacity %d (space leaked or double-counted)",
			s.FreeBytes, s.QuarantinedBytes, s.ReservedBytes, live, s.CapacityBytes)
	}
}

// TestSimulatedCrashTear: SimulateCrash kills at the group it names, with
// none, part or all of it on disk; the Map writes nothing after it, and a
// reopen applies the group's records exactly when they reached the file
// whole.
func TestSimulatedCrashTear(t *testing.T) {
	for _, tc := range []struct {
		name string
		tear func(n int) int
		kept bool // the crashing commit is recovered
	}{
		{"nothing written", func(int) int { return 0 }, false},
		{"torn", func(n int) int { return n - 3 }, false},
		{"whole group", func(n int) int { return n }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "s")
			o := testOpts(t, dir)
			m := mustOpen(t, o)
			before := save(t, m, 2)[0]
			m.SimulateCrash(0, tc.tear)
			res, err := m.Allocate(1)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Commit([]CommitRequest{writeRun(t, m, res[0])}); !errors.Is(err, ErrCrashed) {
				t.Fatalf("commit at the crash: %v", err)
			}
			if err := m.Free(before.ID); !errors.Is(err, ErrCrashed) {
				t.Fatalf("free after the crash: %v", err)
			}
			if err := m.Close(); !errors.Is(err, ErrCrashed) {
				t.Fatalf("close after the crash: %v", err)
			}
			m = mustOpen(t, o)
			defer m.Close()
			if _, ok := m.Lookup(before.ID); !ok {
				t.Fatal("the run acknowledged before the crash is lost")
			}
			if _, ok := m.Lookup(res[0].ID); ok != tc.kept {
				t.Fatalf("crashing commit recovered %v, want %v (report %v)", ok, tc.kept, m.Recovery())
			}
		})
	}
}

// TestJournalSegmentBound: while its checkpoint cannot be written, the
// segment grows only to its hard bound: past it commits fail with ENOSPC
// and the journal says it is failing, until a Sync's group writes the
// checkpoint; then commits work again and a reopen finds every
// acknowledged run.
func TestJournalSegmentBound(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s")
	o := testOpts(t, dir)
	o.SegmentBytes = 1024
	m := mustOpen(t, o)
	m.j.hardBytes = 4096 // what 2 segments and 2 groups would be, scaled down
	fired := injectJournal(t, "checkpoint", false, true, unix.ENOSPC, 1<<30)
	acked := map[RunID]bool{}
	var refused error
	for i := 0; i < 200 && refused == nil; i++ {
		res, err := m.Allocate(1)
		if err != nil {
			t.Fatal(err)
		}
		if refused = m.Commit([]CommitRequest{writeRun(t, m, res[0])}); refused == nil {
			acked[res[0].ID] = true
		}
	}
	if !errors.Is(refused, unix.ENOSPC) || *fired == 0 {
		t.Fatalf("commit past the bound: %v (checkpoint faults %d)", refused, *fired)
	}
	if m.Failing() == nil || m.Stats().JournalBytes > 4096+1024 {
		t.Fatalf("failing %v, segment %d bytes", m.Failing(), m.Stats().JournalBytes)
	}
	if err := m.Sync(); err != nil {
		t.Fatalf("sync while the checkpoint still fails: %v", err)
	}
	if m.Failing() == nil {
		t.Fatal("not failing while the checkpoint still fails")
	}
	testHookJournalIO = nil
	if err := m.Sync(); err != nil || m.Failing() != nil {
		t.Fatalf("sync once the checkpoint fits: %v, failing %v", err, m.Failing())
	}
	for _, r := range save(t, m, 2) {
		acked[r.ID] = true
	}
	m.Close()
	m = mustOpen(t, o)
	defer m.Close()
	for id := range acked {
		if _, ok := m.Lookup(id); !ok {
			t.Fatalf("acknowledged run %d lost", id)
		}
	}
}
