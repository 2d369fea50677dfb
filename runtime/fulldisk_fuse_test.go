package runtime

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tutti-io/tutti/internal/faultfs"
	"github.com/tutti-io/tutti/kvshape"
	"golang.org/x/sys/unix"
)

// The full-disk test puts a store on a small ext4 (internal/faultfs; no
// fault is armed: the file system really runs out of space), fills the
// file system with another file and empties it again. A full disk must skip
// saves, counted as enospc and reported by WaitSaves and Stats, without
// evicting what is stored; saves must resume by themselves once space is
// back; and nothing committed may be lost, across a Close and reopen.

// fullDiskCfg is a store of one directory on d: its pool is written at
// creation (so saves write into allocated blocks: only the journal and
// checkpoint need new ones), its journal segments are segmentBytes.
func fullDiskCfg(t *testing.T, d *faultfs.Device, segmentBytes int64) Config {
	cfg := testConfig(t, tinyGeometry(), kvshape.LayoutPerLayer, 64)
	cfg.Dirs = []string{filepath.Join(d.Dir, "store")}
	cfg.CapacityBytes = 8 << 20
	cfg.WritePool = true
	cfg.segmentBytes = segmentBytes
	return cfg
}

// fillDisk writes a file in dir until the file system has no block left,
// and returns a function that deletes it again.
func fillDisk(t *testing.T, dir string) (empty func()) {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for _, piece := range []int{1 << 20, 4096, 512} {
		for {
			if _, err := f.Write(buf[:piece]); err != nil {
				if !errors.Is(err, unix.ENOSPC) {
					t.Fatalf("filling the disk: %v", err)
				}
				break
			}
		}
	}
	_ = f.Sync() // may fail with ENOSPC too: the blocks are taken either way
	f.Close()
	return func() {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		unix.Sync()
	}
}

// TestFullDisk: the disk fills while the journal appends ("append": a
// group has no room), and when only the checkpoint at the journal's
// rotation does not fit ("checkpoint": saves still commit, the checkpoint
// is retried), then empties.
func TestFullDisk(t *testing.T) {
	for _, tc := range []struct {
		name    string
		segment int64 // journal segment bound
	}{
		{"append", 0},
		// A segment bound inside a file system block: the save that crosses
		// it appends into the block's slack, and the checkpoint after it
		// needs a new file.
		{"checkpoint", 8192 + 1024},
	} {
		t.Run(tc.name, func(t *testing.T) { fullDisk(t, tc.name, tc.segment) })
	}
}

func fullDisk(t *testing.T, stage string, segment int64) {
	d := faultfs.Setup(t, faultfs.Options{SizeBytes: 24 << 20, Timeout: 2 * time.Minute})
	cfg := fullDiskCfg(t, d, segment)
	rng := rand.New(rand.NewPCG(43, uint64(segment)))
	s, kv := openKV(t, cfg)
	closed := false
	t.Cleanup(func() { // before the device's tear-down, also when the test fails
		if !closed {
			closeKV(t, s, kv)
		}
	})
	var acked [][]uint64
	next := uint64(1)
	saveOne := func() (*Save, []uint64) {
		chain := chainOf(next<<32, 2)
		next++
		sv := saveFresh(t, s, kv, rng, chain)
		if sv.Saved() == len(chain) {
			acked = append(acked, chain)
		}
		return sv, chain
	}
	for range 4 {
		saveOne()
	}
	if stage == "checkpoint" { // up to just below the segment bound
		for s.Stats().Map.JournalBytes < segment-150 {
			if sv, _ := saveOne(); sv.Saved() != 2 {
				t.Fatalf("save before the disk filled: %d of 2", sv.Saved())
			}
		}
		if b := s.Stats().Map.JournalBytes; b > segment || b/4096 != segment/4096 {
			t.Fatalf("journal at %d bytes, want just below %d in the same block", b, segment)
		}
	}
	empty := fillDisk(t, d.Dir)
	atFill := len(acked)
	evictionsBefore := s.idx.Stats().Evictions
	var skipped []uint64
	for i := 0; i < 400 && skipped == nil; i++ {
		sv, chain := saveOne()
		switch {
		case sv.Skipped(SkipENOSPC) == len(chain):
			skipped = chain
		case sv.Saved() != len(chain):
			t.Fatalf("save on a full disk: saved %d, skipped %v", sv.Saved(), sv.skipped)
		}
	}
	if skipped == nil {
		t.Fatalf("no save was skipped on a full disk (%+v)", s.Stats().Map)
	}
	ms := s.Stats().Map
	if ms.JournalFailures == 0 || ms.JournalError == "" || s.Stats().Saves.LastFailure == "" {
		t.Fatalf("full disk not reported: map %+v, save failure %q", ms, s.Stats().Saves.LastFailure)
	}
	if stage == "checkpoint" && (ms.CheckpointFailures == 0 || ms.Checkpoints != 0) {
		t.Fatalf("the checkpoint did not meet the full disk: %+v", ms)
	}
	if _, err := os.Stat(filepath.Join(cfg.Dirs[0], "checkpoint.tmp")); !os.IsNotExist(err) {
		t.Fatalf("checkpoint.tmp left behind: %v", err)
	}
	// While the disk stays full, saves are skipped before they reserve
	// anything: nothing stored is evicted for them.
	for range 3 {
		if sv, chain := saveOne(); sv.Skipped(SkipENOSPC) != len(chain) {
			t.Fatalf("save while still full: saved %d, skipped %v", sv.Saved(), sv.skipped)
		}
	}
	if ev := s.idx.Stats().Evictions; ev != evictionsBefore {
		t.Fatalf("%d blocks evicted for saves that could not commit", ev-evictionsBefore)
	}
	err := s.WaitSaves()
	if !errors.Is(err, ErrSavesFailed) || !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("WaitSaves after skipped saves: %v", err)
	}
	full := s.Stats()
	before := len(acked)

	empty()
	for i := range 30 {
		if sv, _ := saveOne(); sv.Saved() != 2 {
			t.Fatalf("save %d after the disk emptied: saved %d, skipped %v (%+v)", i, sv.Saved(), sv.skipped, s.Stats().Map)
		}
	}
	if err := s.WaitSaves(); err != nil {
		t.Fatalf("WaitSaves after saves resumed: %v", err)
	}
	ms = s.Stats().Map
	t.Logf("%s: %d saves committed before the disk filled, %d on the full disk (into the journal's last block), then %d blocks skipped as enospc (%d journal groups undone, %d commits abandoned, %d checkpoints retried), 0 evicted; %d saves committed after it emptied; WaitSaves on the full disk: %v",
		stage, atFill, before-atFill, full.Saves.SkippedBlocks[SkipENOSPC], ms.JournalFailures, ms.AbandonedCommits, ms.CheckpointFailures, len(acked)-before, err)
	if ms := s.Stats().Map; ms.JournalError != "" || (stage == "checkpoint" && ms.Checkpoints == 0) {
		t.Fatalf("journal after the disk emptied: %+v", ms)
	}
	for _, c := range acked {
		loadExact(t, s, kv, rng, c, len(c))
	}
	closed = true
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	closed = false
	s, kv = openAgain(t, cfg, kv)
	if rep := s.Recovery(); !rep.Map.Clean() || rep.DroppedRuns != 0 || rep.IndexedRuns != len(acked) {
		t.Fatalf("recovery: %d runs indexed, %d acknowledged: %+v", rep.IndexedRuns, len(acked), rep)
	}
	for _, c := range acked {
		loadExact(t, s, kv, rng, c, len(c))
	}
	if n := s.Lookup(skipped); n != 0 {
		t.Fatalf("a skipped save's blocks are served after reopen: %d", n)
	}
	if rep, err := s.Check(); err != nil || !rep.Clean() {
		t.Fatalf("fsck: %v %v", rep, err)
	}
	closed = true
	closeKV(t, s, kv)
}
