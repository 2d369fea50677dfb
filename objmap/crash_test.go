package objmap

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// TestSimulatedCrash runs seeded random workloads (save, free, trim, sync,
// abort, reservations written but not committed), then crashes: descriptors
// are closed with nothing flushed, and the journal gets a random prefix of
// the records that were in flight (frees and trims not yet synced, commits whose header
// and payload were durable but whose record was being written), possibly
// cut inside a record. After reopening, exactly the durable records count:
// every acknowledged commit is served bit-exact, every in-flight record is
// applied if and only if it is complete, nothing else is served, and fsck's
// Check finds nothing corrupt. OBJMAP_CRASH_SEED=N reruns one seed.
func TestSimulatedCrash(t *testing.T) {
	seeds := make([]uint64, 0, 40)
	if s := os.Getenv("OBJMAP_CRASH_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, v)
	} else {
		for i := uint64(1); i <= 30; i++ {
			seeds = append(seeds, i)
		}
	}
	for _, seed := range seeds {
		if !t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { crashOnce(t, seed) }) {
			t.Fatalf("failed with seed %d (rerun: OBJMAP_CRASH_SEED=%d go test -race -run TestSimulatedCrash ./objmap)", seed, seed)
		}
	}
}

func crashOnce(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x7777))
	dir := filepath.Join(t.TempDir(), "s")
	o := testOpts(t, dir)
	if seed%2 == 0 { // even seeds: runs spread over two directories
		o = testOpts(t, dir, filepath.Join(t.TempDir(), "s1"))
	}
	o.SegmentBytes = []int64{512, 2048, 1 << 20}[rng.IntN(3)]
	m := mustOpen(t, o)

	acked := map[RunID]RunInfo{} // Commit returned nil, no free durable; Kept as durable
	var queued []Record          // frees and trims returned, not yet followed by a durable write
	var open []Reservation       // allocated, written, not committed
	// durable applies the queued records: a group or a Sync wrote them.
	durable := func() {
		for _, r := range queued {
			if r.Type == RecFree {
				delete(acked, r.ID)
			} else if a, ok := acked[r.ID]; ok {
				a.Kept = min(a.Kept, r.Keep)
				acked[r.ID] = a
			}
		}
		queued = nil
	}
	freeQueued := func(id RunID) bool {
		return slices.ContainsFunc(queued, func(r Record) bool { return r.Type == RecFree && r.ID == id })
	}
	ops := 20 + rng.IntN(80)
	for i := 0; i < ops; i++ {
		switch p := rng.IntN(100); {
		case p < 45:
			res, err := m.Allocate(1 + rng.IntN(6))
			if errors.Is(err, ErrNoSpace) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			var reqs []CommitRequest
			for _, r := range res {
				reqs = append(reqs, writeRun(t, m, r))
			}
			if err := m.Commit(reqs); err != nil {
				t.Fatal(err)
			}
			durable() // the commit's group covered them
			for _, r := range res {
				info, _ := m.Lookup(r.ID)
				acked[r.ID] = info
			}
		case p < 72:
			if len(acked) == 0 {
				continue
			}
			ids := sortedIDs(acked)
			id := ids[rng.IntN(len(ids))]
			if freeQueued(id) {
				continue
			}
			info, _ := m.Lookup(id)
			r := Record{Type: RecFree, ID: id}
			if p >= 62 && info.Kept > 1 {
				r = Record{Type: RecTrim, ID: id, Keep: 1 + rng.IntN(info.Kept-1)}
				if err := m.Trim(id, r.Keep); err != nil {
					t.Fatal(err)
				}
			} else if err := m.Free(id); err != nil {
				t.Fatal(err)
			}
			queued = append(queued, r)
		case p < 80:
			if err := m.Sync(); err != nil {
				t.Fatal(err)
			}
			durable()
		case p < 92:
			res, err := m.Allocate(1 + rng.IntN(3))
			if err != nil {
				continue
			}
			for _, r := range res {
				writeRun(t, m, r)
				open = append(open, r)
			}
		default:
			if len(open) > 0 {
				k := rng.IntN(len(open))
				if err := m.Abort(open[k]); err != nil {
					t.Fatal(err)
				}
				open = slices.Delete(open, k, k+1)
			}
		}
	}

	// The crash. In flight: the queued frees, then commits of some open
	// reservations whose header and payload are durable.
	type inflight struct {
		end int
		rec *Record // a queued free or trim
		run *RunInfo
	}
	var tail []byte
	var recs []inflight
	for i := range queued {
		tail, _ = AppendRecord(tail, &queued[i])
		recs = append(recs, inflight{end: len(tail), rec: &queued[i]})
	}
	for _, r := range open {
		if rng.IntN(2) == 0 {
			continue
		}
		req := writeRun(t, m, r)
		writeHeaderForTest(t, m, req)
		info := RunInfo{ID: r.ID, Generation: r.Generation, File: r.File, Offset: r.Offset, Length: r.Length, Chain: req.Chain,
			Parent: req.Parent, HasParent: req.HasParent, Kept: len(req.Chain)}
		tail, _ = AppendRecord(tail, &Record{Type: RecCommit, Run: info})
		recs = append(recs, inflight{end: len(tail), run: &info})
	}
	cut := 0
	if len(tail) > 0 {
		cut = rng.IntN(len(tail) + 1)
	}
	seg := filepath.Join(dir, segmentName(m.j.seq))
	m.closeFiles() // crash: nothing flushed
	f, err := os.OpenFile(seg, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	written := slices.Clone(tail[:cut])
	if rng.IntN(3) == 0 { // a hole of zeros past the tail (page written out of order)
		written = append(written, make([]byte, 1+rng.IntN(5000))...)
	}
	f.Write(written)
	f.Close()

	want := map[RunID]bool{}
	for id := range acked {
		want[id] = true
	}
	// A record is on disk when its bytes are: cut short, or completed by
	// the zeros of a hole where its own last bytes are zeros.
	start := 0
	for _, r := range recs {
		if r.end > len(written) || !bytes.Equal(written[start:r.end], tail[start:r.end]) {
			break
		}
		start = r.end
		switch {
		case r.run != nil:
			want[r.run.ID] = true
			acked[r.run.ID] = *r.run
		case r.rec.Type == RecFree:
			delete(want, r.rec.ID)
		default:
			if a, ok := acked[r.rec.ID]; ok {
				a.Kept = min(a.Kept, r.rec.Keep)
				acked[r.rec.ID] = a
			}
		}
	}

	m = mustOpen(t, o)
	defer m.Close()
	rep := m.Recovery()
	t.Logf("seed %d: %d ops, segment bound %d, %d in-flight records (%d bytes) cut at %d; %v",
		seed, ops, o.SegmentBytes, len(recs), len(tail), cut, rep)
	if rep.Dropped != 0 || rep.Recovered != len(want) {
		t.Fatalf("seed %d: report %v, want %d recovered, 0 dropped", seed, rep, len(want))
	}
	var live int64
	m.Runs(func(r RunInfo) bool {
		if !want[r.ID] {
			t.Errorf("seed %d: run %d served, never durably committed (or durably freed)", seed, r.ID)
		} else if r.Kept != acked[r.ID].Kept {
			t.Errorf("seed %d: run %d keeps %d chunks, durably %d", seed, r.ID, r.Kept, acked[r.ID].Kept)
		}
		live += m.Layout().Footprint(r.Chunks())
		return true
	})
	for id := range want {
		r, ok := m.Lookup(id)
		if !ok {
			t.Fatalf("seed %d: durable run %d lost", seed, id)
		}
		readBack(t, m, r, rng.IntN(tinyGeom.Layers), 1+rng.IntN(r.Chunks()))
	}
	if c, err := m.Check(); err != nil || c.Corrupt != 0 {
		t.Fatalf("seed %d: check %v %v", seed, c, err)
	}
	if s := m.Stats(); s.FreeBytes+live != s.CapacityBytes {
		t.Fatalf("seed %d: free %d + live %d != capacity %d (space leaked or double-counted)", seed, s.FreeBytes, live, s.CapacityBytes)
	}
	// The store keeps working after recovery.
	if _, err := m.Allocate(1); err != nil && !errors.Is(err, ErrNoSpace) {
		t.Fatal(err)
	}
}

func sortedIDs(m map[RunID]RunInfo) []RunID {
	ids := make([]RunID, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// writeHeaderForTest does the first half of Commit: header written and synced.
func writeHeaderForTest(t *testing.T, m *Map, req CommitRequest) {
	t.Helper()
	if _, err := m.writeHeaders([]CommitRequest{req}); err != nil {
		t.Fatal(err)
	}
}

// TestCrashBetweenCheckpointAndSegment crashes after the checkpoint was
// renamed into place but before the next segment exists.
func TestCrashBetweenCheckpointAndSegment(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s")
	o := testOpts(t, dir)
	o.SegmentBytes = 4096
	m := mustOpen(t, o)
	crash := errors.New("simulated crash")
	acked := map[RunID]bool{}
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		if i == 3 {
			testHookAfterCheckpointRename = func() error { return crash }
			defer func() { testHookAfterCheckpointRename = nil }()
		}
		var res []Reservation
		res, err = m.Allocate(1)
		if err != nil {
			t.Fatal(err)
		}
		err = m.Commit([]CommitRequest{writeRun(t, m, res[0])})
		if err == nil {
			acked[res[0].ID] = true
		}
	}
	if !errors.Is(err, crash) {
		t.Fatalf("no checkpoint reached the hook: %v", err)
	}
	// The store failed closed.
	if _, err := m.Allocate(1); err == nil {
		t.Fatal("allocation after a failed checkpoint")
	}
	m.closeFiles()
	testHookAfterCheckpointRename = nil
	m = mustOpen(t, o)
	defer m.Close()
	rep := m.Recovery()
	if rep.CheckpointRuns == 0 || rep.Dropped != 0 {
		t.Fatalf("report %v", rep)
	}
	for id := range acked {
		if _, ok := m.Lookup(id); !ok {
			t.Fatalf("acknowledged run %d lost", id)
		}
	}
	// The commit that failed had its record covered by the checkpoint: it may
	// be served (its header and payload were durable), and nothing else is.
	if rep.Recovered > len(acked)+1 {
		t.Fatalf("%d runs recovered, %d acknowledged", rep.Recovered, len(acked))
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "journal-*.log"))
	if len(segs) != 1 || filepath.Base(segs[0]) != segmentName(rep.JournalSegment) {
		t.Fatalf("segments %v, checkpoint names %d", segs, rep.JournalSegment)
	}
	save(t, m, 2)
}
