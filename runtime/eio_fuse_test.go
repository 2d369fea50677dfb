package runtime

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tutti-io/tutti/internal/faultfs"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/catalog"
)

// The EIO tests put a store on a file system whose device fails on command
// (internal/faultfs: ext4 on a direct-I/O loop device over a FUSE file), so
// the errors come from the kernel where a failing disk returns them. Each
// stage checks what the store promises: a miss or a skipped save, counted;
// never a wrong byte; the store keeps working (or fails closed until it is
// reopened); and fsck's verdict right afterwards.

// eioStore is a store of one directory on a fresh faultfs device. One
// directory and one pool file, so that the file a save writes is known.
func eioStore(t *testing.T) (*faultfs.Device, Config) {
	t.Helper()
	d := faultfs.Setup(t, faultfs.Options{SizeBytes: 48 << 20, Timeout: 2 * time.Minute})
	cfg := testConfig(t, tinyGeometry(), kvshape.LayoutPerLayer, 64)
	cfg.Dirs = []string{filepath.Join(d.Dir, "store")}
	cfg.CapacityBytes = 16 << 20
	return d, cfg
}

// fsckStore is what `tutti fsck --dir D...` does (cmd/tutti runFsck): open
// the store read-only, recover it as Open would, read every served run's
// payload and verify its CRCs. An ErrCorruptStore from Open is the
// command's "corrupt" verdict and is returned as the error.
func fsckStore(t *testing.T, dirs []string) (objmap.RecoveryReport, error) {
	t.Helper()
	m, err := objmap.Open(objmap.Options{Dirs: dirs, ReadOnly: true})
	if err != nil {
		if !errors.Is(err, objmap.ErrCorruptStore) {
			t.Fatalf("fsck: %v", err)
		}
		return objmap.RecoveryReport{}, err
	}
	rep, err := m.Check()
	if cerr := m.Close(); cerr != nil {
		t.Fatalf("fsck: close: %v", cerr)
	}
	if err != nil {
		t.Fatalf("fsck: check: %v", err)
	}
	return rep, nil
}

// fsckClean asserts fsck finds every one of want runs and nothing wrong.
func fsckClean(t *testing.T, dirs []string, want int) objmap.RecoveryReport {
	t.Helper()
	rep, err := fsckStore(t, dirs)
	if err != nil || rep.Corrupt != 0 || rep.Dropped != 0 || rep.Recovered != want {
		t.Fatalf("fsck: %v, report %v; want clean with %d runs", err, rep, want)
	}
	return rep
}

// armFile fails the requests of kind op to bytes [off, off+n) of the file
// at path, wherever they lie on the device (one rule per extent).
func armFile(t *testing.T, d *faultfs.Device, op faultfs.Op, path string, off, n int64) []*faultfs.Fault {
	t.Helper()
	ext, err := d.Extents(path, off, n)
	if err != nil {
		t.Fatal(err)
	}
	var out []*faultfs.Fault
	for _, e := range ext {
		f, err := d.Inj.Arm(faultfs.Rule{Op: op, Off: e.Physical, Len: e.Length,
			Note: filepath.Base(path) + " +" + strconv.FormatInt(e.Logical, 10)})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, f)
	}
	return out
}

func hits(fs []*faultfs.Fault) int64 {
	var n int64
	for _, f := range fs {
		n += f.Hits()
	}
	return n
}

// mustFire fails t when the armed faults failed no request: the stage did
// not test what it names.
func mustFire(t *testing.T, stage string, fs []*faultfs.Fault) {
	t.Helper()
	if hits(fs) == 0 {
		t.Fatalf("%s: the injected fault never fired (the I/O did not reach the device)", stage)
	}
	t.Logf("%s: %d requests failed with EIO", stage, hits(fs))
}

// loadExact loads chain into fresh pages and asserts that exactly want
// blocks are restored, bit for bit.
func loadExact(t *testing.T, s *Store, kv *HostKV, rng *rand.Rand, chain []uint64, want int) *Load {
	t.Helper()
	g := s.Geometry()
	pages := pageTable(rng, g, s.Config().NumPages, len(chain))
	scramble(kv, g, s.Config().NumPages)
	l := loadWait(t, s, chain, pages)
	if err := verify(kv, g, chain, pages, l.Blocks()); err != nil {
		t.Fatalf("served wrong data: %v", err)
	}
	if l.Blocks() != want {
		t.Fatalf("restored %d blocks of %d, want %d (failure: %v)", l.Blocks(), len(chain), want, l.Failure())
	}
	return l
}

// saveFresh fills chain's pages and saves it.
func saveFresh(t *testing.T, s *Store, kv *HostKV, rng *rand.Rand, chain []uint64) *Save {
	t.Helper()
	g := s.Geometry()
	pages := pageTable(rng, g, s.Config().NumPages, len(chain))
	fill(kv, g, chain, pages)
	return saveWait(t, s, chain, pages)
}

// skippedIO asserts that a save stored nothing and counted its blocks as
// SkipIOError.
func skippedIO(t *testing.T, what string, sv *Save, chain []uint64) {
	t.Helper()
	if sv.Saved() != 0 || sv.Skipped(SkipIOError) != len(chain) {
		t.Fatalf("%s: saved %d, skipped for I/O errors %d, want 0 and %d", what, sv.Saved(), sv.Skipped(SkipIOError), len(chain))
	}
}

// openAgain frees kv (of a store already closed) and opens the store again
// with fresh KV memory.
func openAgain(t *testing.T, cfg Config, kv *HostKV) (*Store, *HostKV) {
	t.Helper()
	if err := kv.Free(); err != nil {
		t.Fatal(err)
	}
	return openKV(t, cfg)
}

// runOf returns the stored run that starts at chain block id first.
func runOf(t *testing.T, s *Store, first uint64) *catalog.Run {
	t.Helper()
	if r := runStartingAt(s, first); r != nil {
		return r
	}
	t.Fatalf("no run starts at block %#x", first)
	return nil
}

// TestEIOPayloadRead: reads of one run's objects fail. That run and those
// after it in the chain are misses (counted as I/O errors), every block
// reported restored is exact, other chains load whole, fsck names the run
// while the device fails and finds it whole once it recovers; the run stays
// stored (a read error is not corruption).
func TestEIOPayloadRead(t *testing.T) {
	d, cfg := eioStore(t)
	rng := rand.New(rand.NewPCG(11, 1))
	chains := saveChains(t, cfg, rng, 2) // two runs of 3 blocks per chain
	s, kv := openKV(t, cfg)
	defer func() { closeKV(t, s, kv) }()
	r := runOf(t, s, chains[0][3])
	faults := armFile(t, d, faultfs.Read, r.File.Path, r.Offset, r.Info.Length)

	loadExact(t, s, kv, rng, chains[0], 3)
	mustFire(t, "payload read", faults)
	if st := s.Stats(); st.Loads.MissBlocks[MissIOError] != 3 || st.Loads.CorruptDroppedRuns != 0 {
		t.Fatalf("stats: I/O-error misses %d, dropped %d; want 3 and 0 (%v)", st.Loads.MissBlocks[MissIOError], st.Loads.CorruptDroppedRuns, st)
	}
	loadExact(t, s, kv, rng, chains[1], 6)

	rep, err := s.Check()
	if err != nil {
		t.Fatal(err)
	}
	if rep.Corrupt != 1 || len(rep.CorruptRuns) != 1 || rep.CorruptRuns[0].Run != r.ID ||
		!strings.Contains(rep.CorruptRuns[0].Reason, "input/output error") {
		t.Fatalf("fsck while reads of run %d fail: %v, want that run named with its I/O error", r.ID, rep)
	}

	d.Inj.DisarmAll()
	loadExact(t, s, kv, rng, chains[0], 6)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	fsckClean(t, cfg.Dirs, 4)
	s, kv = openAgain(t, cfg, kv)
	loadExact(t, s, kv, rng, chains[0], 6)
}

// TestEIOHeaderAtOpen: the read of one run's header fails while the store
// opens. fsck names the run as unreadable; Open opens the store, reports the
// run unreadable (not freed) and serves the rest, exactly; once the device
// reads again, the next Open finds the run and serves it: a transient read
// error loses no committed run.
func TestEIOHeaderAtOpen(t *testing.T) {
	d, cfg := eioStore(t)
	rng := rand.New(rand.NewPCG(12, 1))
	chains := saveChains(t, cfg, rng, 2)
	s, kv := openKV(t, cfg)
	r := runOf(t, s, chains[0][3])
	path, off, id := r.File.Path, r.Offset, r.ID
	closeKV(t, s, kv)
	faults := armFile(t, d, faultfs.Read, path, off, objmap.BlockBytes)

	rep, err := fsckStore(t, cfg.Dirs)
	mustFire(t, "header read (fsck)", faults)
	named := false
	for _, p := range rep.UnreadableRuns {
		named = named || p.Run == id && strings.Contains(p.Reason, "input/output error")
	}
	if err != nil || !named || rep.Clean() {
		t.Fatalf("fsck while run %d's header cannot be read: %v (%v), want the run named unreadable and the store not clean", id, rep, err)
	}

	before := hits(faults)
	s, kv = openKV(t, cfg)
	if hits(faults) == before {
		t.Fatal("Open did not read the header through the device")
	}
	mr := s.Recovery().Map
	if mr.Unreadable != 1 || mr.UnreadableRuns[0].Run != id || mr.Recovered != 3 || mr.Dropped != 0 {
		t.Fatalf("Open's report %v, want run %d unreadable, none dropped and 3 recovered", mr, id)
	}
	if n := s.Lookup(chains[0]); n != 3 {
		t.Fatalf("Lookup = %d blocks, want the 3 before the unreadable run", n)
	}
	loadExact(t, s, kv, rng, chains[0], 3)
	loadExact(t, s, kv, rng, chains[1], 6)
	d.Inj.DisarmAll()
	closeKV(t, s, kv)
	fsckClean(t, cfg.Dirs, 4)
	t.Logf("header read at Open: the run is unreadable while the device fails, served again after: 0 committed runs lost, 0 wrong bytes")
	s, kv = openAgain(t, cfg, kv)
	defer func() { closeKV(t, s, kv) }()
	loadExact(t, s, kv, rng, chains[0], 6)
}

// TestEIOWrite: every write to the pool file fails. The save stores
// nothing and counts its blocks as I/O errors; no write error is sticky, so
// once the device recovers the next save is stored; earlier runs stay
// exact; fsck finds a clean store with the runs that were saved.
func TestEIOWrite(t *testing.T) {
	d, cfg := eioStore(t)
	rng := rand.New(rand.NewPCG(13, 1))
	s, kv := openKV(t, cfg)
	defer func() { closeKV(t, s, kv) }()
	a, b, c := chainOf(1<<32, 3), chainOf(2<<32, 3), chainOf(3<<32, 3)
	if sv := saveFresh(t, s, kv, rng, a); sv.Saved() != 3 {
		t.Fatalf("saved %d of 3", sv.Saved())
	}
	pool := s.m.Files()[0].Path
	st, err := os.Stat(pool)
	if err != nil {
		t.Fatal(err)
	}
	faults := armFile(t, d, faultfs.Write, pool, 0, st.Size())
	skippedIO(t, "save while pool writes fail", saveFresh(t, s, kv, rng, b), b)
	mustFire(t, "write", faults)
	d.Inj.DisarmAll()
	if sv := saveFresh(t, s, kv, rng, c); sv.Saved() != 3 {
		t.Fatalf("save after the device recovered: saved %d of 3", sv.Saved())
	}
	if st := s.Stats(); st.Saves.SkippedBlocks[SkipIOError] != 3 || st.Saves.SavedBlocks != 6 {
		t.Fatalf("stats: skipped for I/O errors %d, saved %d; want 3 and 6 (%v)", st.Saves.SkippedBlocks[SkipIOError], st.Saves.SavedBlocks, st)
	}
	if n := s.Lookup(b); n != 0 {
		t.Fatalf("Lookup of the failed save = %d blocks, want 0", n)
	}
	loadExact(t, s, kv, rng, a, 3)
	loadExact(t, s, kv, rng, c, 3)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	fsckClean(t, cfg.Dirs, 2)
	s, kv = openAgain(t, cfg, kv)
	loadExact(t, s, kv, rng, a, 3)
	loadExact(t, s, kv, rng, c, 3)
}

// failedCommit is the journal-append and fsync stages: fail arms the fault
// after one save is stored; the next save's commit fails (its blocks
// counted as I/O errors), and the store fails closed: a save after the
// device recovered is skipped too, until the store is reopened. The run
// stored before is exact throughout; after a remount (what is on the
// device, not in the page cache) fsck finds a clean store holding it, and
// the reopened store serves it and stores new saves. The failed save was
// never acknowledged: the store may or may not hold it, but what it serves
// of it is exact.
func failedCommit(t *testing.T, stage string, fail func(d *faultfs.Device, s *Store) []*faultfs.Fault) {
	d, cfg := eioStore(t)
	rng := rand.New(rand.NewPCG(14, uint64(len(stage))))
	s, kv := openKV(t, cfg)
	defer func() { closeKV(t, s, kv) }()
	a, b, c := chainOf(1<<32, 3), chainOf(2<<32, 3), chainOf(3<<32, 3)
	if sv := saveFresh(t, s, kv, rng, a); sv.Saved() != 3 {
		t.Fatalf("saved %d of 3", sv.Saved())
	}
	faults := fail(d, s)
	skippedIO(t, "save while "+stage+" fails", saveFresh(t, s, kv, rng, b), b)
	mustFire(t, stage, faults)
	d.Inj.DisarmAll()
	skippedIO(t, "save after the device recovered (fail closed)", saveFresh(t, s, kv, rng, c), c)
	if st := s.Stats(); st.Saves.SkippedBlocks[SkipIOError] != 6 || st.Saves.SavedBlocks != 3 {
		t.Fatalf("stats: skipped for I/O errors %d, saved %d; want 6 and 3 (%v)", st.Saves.SkippedBlocks[SkipIOError], st.Saves.SavedBlocks, st)
	}
	loadExact(t, s, kv, rng, a, 3)
	if err := s.Close(); err != nil {
		t.Logf("Close after the failed commit: %v", err)
	}
	if err := d.Remount(); err != nil {
		t.Fatal(err)
	}
	rep, err := fsckStore(t, cfg.Dirs)
	if err != nil || rep.Corrupt != 0 || rep.Dropped != 0 || rep.Recovered < 1 || rep.Recovered > 2 {
		t.Fatalf("fsck after the failed commit: %v, report %v; want clean with run a (and maybe b)", err, rep)
	}
	t.Logf("%s: fsck after a remount: %v", stage, rep)
	s, kv = openAgain(t, cfg, kv)
	loadExact(t, s, kv, rng, a, 3)
	got := s.Lookup(b)
	if got != 0 && got != 3 {
		t.Fatalf("Lookup of the failed save = %d blocks, want 0 or 3", got)
	}
	loadExact(t, s, kv, rng, b, got)
	t.Logf("%s: the unacknowledged save is held after reopen: %v", stage, got == 3)
	if sv := saveFresh(t, s, kv, rng, c); sv.Saved() != 3 {
		t.Fatalf("save after reopen: saved %d of 3", sv.Saved())
	}
	loadExact(t, s, kv, rng, c, 3)
}

// TestEIOJournalAppend: the writeback of the journal's last block fails, so
// the commit's fdatasync of the journal returns EIO.
func TestEIOJournalAppend(t *testing.T) {
	failedCommit(t, "journal append", func(d *faultfs.Device, s *Store) []*faultfs.Fault {
		segs, err := filepath.Glob(filepath.Join(s.Config().Dirs[0], "journal-*.log"))
		if err != nil || len(segs) != 1 {
			t.Fatalf("journal segments %v (%v), want one", segs, err)
		}
		st, err := os.Stat(segs[0])
		if err != nil {
			t.Fatal(err)
		}
		// The next record goes into the block that holds the segment's end
		// (records are small); a new block would be allocated elsewhere.
		last := (st.Size() - 1) &^ (objmap.BlockBytes - 1)
		if st.Size()+512 > last+objmap.BlockBytes {
			t.Fatalf("journal segment of %d bytes: the next record may start a new block", st.Size())
		}
		return armFile(t, d, faultfs.Write, segs[0], last, st.Size()-last)
	})
}

// TestEIOFsync: every flush of the device fails, so the commit's fdatasync
// of the pool file returns EIO.
func TestEIOFsync(t *testing.T) {
	failedCommit(t, "fsync", func(d *faultfs.Device, s *Store) []*faultfs.Fault {
		f, err := d.Inj.Arm(faultfs.Rule{Op: faultfs.Fsync, Note: "every flush"})
		if err != nil {
			t.Fatal(err)
		}
		return []*faultfs.Fault{f}
	})
}
