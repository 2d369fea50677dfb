package admission

import (
	"errors"
	"testing"
	"time"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/prefix"
	"github.com/tutti-io/tutti/runtime/internal/catalog"
	"github.com/tutti-io/tutti/runtime/internal/iosched"
	"github.com/tutti-io/tutti/runtime/internal/kvmeta"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/sched"
)

// geo has 256 KiB chunks per layer: a save of 8 blocks is striped over two
// directories (minStripeLayerBytes), and 1 MiB writes cut no chunk.
var geo = kvshape.Geometry{Layers: 2, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 4}

// newStore is a store's parts over fresh buffered directories: a pool of
// capacity bytes, a scheduler with a per-device save budget (0: none).
func newStore(t *testing.T, dirs int, capacity, budget int64) *Store {
	t.Helper()
	var ds []string
	for range dirs {
		ds = append(ds, t.TempDir())
	}
	m, err := objmap.Open(objmap.Options{Dirs: ds, CapacityBytes: capacity, Geometry: geo, Buffered: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	pidx, err := prefix.New(prefix.Config{CapacityBytes: prefix.MaxCapacityBytes})
	if err != nil {
		t.Fatal(err)
	}
	idx, err := kvmeta.Open(pidx, nil, ds[0], geo.ChunkPages*geo.PageTokens, nil)
	if err != nil {
		t.Fatal(err)
	}
	cat := catalog.New(m, idx, dirs, geo.ChunkBytes())
	if _, err := cat.Recover(geo.Layers); err != nil {
		t.Fatal(err)
	}
	p := sched.DeviceProfile{ReadBytesPerSec: 2e9, WriteBytesPerSec: 1e9, ReadIOPS: 2e5, WriteIOPS: 1e5,
		ReadLatencyNs: 1e5, ReadShareUnderWrites: 0.5, WriteShareUnderReads: 0.5}
	devs := make([]sched.DeviceConfig, dirs)
	for i := range devs {
		devs[i] = sched.DeviceConfig{Profile: p, MaxPendingSaveBytes: budget}
	}
	const maxWrite = 1 << 20
	sc, err := iosched.New(sched.Config{Layers: geo.Layers, BlockTokens: geo.ChunkPages * geo.PageTokens,
		Compute: sched.ComputeModel{PerTokenNs: 1e6}, Devices: devs, SaveBoundNs: 600e9, MaxWriteIOBytes: maxWrite})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sc.Close)
	return &Store{Ctl: &Local{Index: idx, Catalog: cat, Map: m}, Sched: sc, Geo: geo, Dirs: dirs, MaxWriteIOBytes: maxWrite}
}

// tally is what a transaction reported.
type tally struct {
	skipped [Failure + 1]int
	errs    []error
	saved   int
}

func (c *tally) events() Events {
	return Events{
		Skip: func(cause Cause, blocks int, err error) {
			c.skipped[cause] += blocks
			if err != nil && blocks > 0 {
				c.errs = append(c.errs, err)
			}
		},
		Saved: func(blocks int) { c.saved += blocks },
	}
}

func noJournalError() error { return nil }

func chain(base uint64, n int) []uint64 {
	c := make([]uint64, n)
	for i := range c {
		c[i] = base + uint64(i)
	}
	return c
}

// drive plays the write pipeline: every routed write of a writable run
// completes with the chunk pieces it covers (or failWrite's error), every
// write is retired, and the transaction is settled at the end.
func drive(t *testing.T, st *Store, txn *Txn, failWrite func(run int, io sched.IO) error) {
	t.Helper()
	driveSettling(t, st, txn, failWrite, false)
}

// driveSettling is drive that, with often, also settles after every write
// retired, as the pipeline settles whenever none of its writes is in
// flight.
func driveSettling(t *testing.T, st *Store, txn *Txn, failWrite func(run int, io sched.IO) error, often bool) {
	t.Helper()
	cb := st.Geo.ChunkBytesPerLayer()
	for left := txn.Writes(); left > 0; left-- {
		var io sched.IO
		select {
		case io = <-txn.IOs():
		case <-time.After(10 * time.Second):
			t.Fatalf("%d writes never routed", left)
		}
		ri := txn.RunOf(io.ReqID)
		if txn.Writable(ri) {
			txn.Started(ri)
			res, _ := txn.Target(ri)
			var parts []mover.Piece
			for off, end := io.OffsetBytes, io.OffsetBytes+io.Bytes; off < end; {
				n := min(cb-off%cb, end-off)
				mover.AddPiece(&parts, io.Layer, res.Chunks, cb, off, n)
				off += n
			}
			var err error
			if failWrite != nil {
				err = failWrite(ri, io)
			}
			txn.Completed(ri, parts, err)
		}
		st.Sched.Complete(io, txn.Retire(ri))
		if often {
			txn.Settle()
		}
	}
	txn.Settle()
}

// settledClean checks that nothing of the save is left pending in the index
// or reserved in the pool.
func settledClean(t *testing.T, st *Store) {
	t.Helper()
	if p := local(st).Index.Stats().Pending; p != 0 {
		t.Errorf("%d blocks left pending in the index", p)
	}
	if r := local(st).Map.Stats().ReservedBytes; r != 0 {
		t.Errorf("%d bytes left reserved in the pool", r)
	}
}

// TestAdmitCommit: a save admitted whole is striped over the directories,
// committed run by run and served; saving it again skips it as cached.
func TestAdmitCommit(t *testing.T) {
	st := newStore(t, 2, 64<<20, 0)
	c := chain(100, 8)
	var got tally
	txn := Admit(st, c, nil, noJournalError, got.events())
	if txn.Writes() == 0 || txn.GatherWrites() != txn.Writes() {
		t.Fatalf("%d writes, %d gathered", txn.Writes(), txn.GatherWrites())
	}
	drive(t, st, txn, nil)
	if got.saved != len(c) || got.skipped != [Failure + 1]int{} {
		t.Fatalf("saved %d, skipped %v", got.saved, got.skipped)
	}
	if pieces, entries := txn.Pieces(); pieces != entries {
		t.Errorf("%d pieces for %d chunk entries: 1 MiB writes of 256 KiB chunks cut none", pieces, entries)
	}
	if n := local(st).Index.Lookup(c); n != len(c) || len(local(st).Catalog.Runs()) != 2 {
		t.Fatalf("%d blocks served in %d runs", n, len(local(st).Catalog.Runs()))
	}
	settledClean(t, st)

	var again tally
	if txn := Admit(st, c, nil, noJournalError, again.events()); txn.Writes() != 0 || again.skipped[Cached] != len(c) {
		t.Fatalf("saved again: %d writes, skipped %v", txn.Writes(), again.skipped)
	}
}

// TestJournalFull: with the journal failing nothing is reserved and every
// uncached block is a Failure, with the journal's error.
func TestJournalFull(t *testing.T) {
	st := newStore(t, 1, 64<<20, 0)
	full := errors.New("journal: no space")
	var got tally
	txn := Admit(st, chain(1, 4), nil, func() error { return full }, got.events())
	if txn.Writes() != 0 || got.skipped[Failure] != 4 || len(got.errs) != 1 || !errors.Is(got.errs[0], full) {
		t.Fatalf("%d writes, skipped %v, errors %v", txn.Writes(), got.skipped, got.errs)
	}
	settledClean(t, st)
}

// TestWriteFailureGivesUpTheRest: a failed write of run 1 gives up run 1
// and every run after it, with the write's error; run 0 is committed and
// nothing stays reserved.
func TestWriteFailureGivesUpTheRest(t *testing.T) {
	st := newStore(t, 2, 64<<20, 0)
	c := chain(200, 8)
	var got tally
	txn := Admit(st, c, nil, noJournalError, got.events())
	eio := errors.New("EIO")
	drive(t, st, txn, func(run int, io sched.IO) error {
		if run == 1 && io.Layer == 1 {
			return eio
		}
		return nil
	})
	if got.saved != 4 || got.skipped[Failure] != 4 || len(got.errs) != 1 || !errors.Is(got.errs[0], eio) {
		t.Fatalf("saved %d, skipped %v, errors %v", got.saved, got.skipped, got.errs)
	}
	if n := local(st).Index.Lookup(c); n != 4 {
		t.Fatalf("%d blocks served, want run 0's 4", n)
	}
	settledClean(t, st)
}

// TestPoolShortfall: blocks the index took but the pool has no room for are
// given up as NoSpace; the leading ones are admitted and committed.
func TestPoolShortfall(t *testing.T) {
	lay, err := objmap.NewLayout(geo, 1, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	runBytes := lay.RunBytes(4)
	st := newStore(t, 1, 8*runBytes, 0)
	c := chain(300, 24)
	var got tally
	txn := Admit(st, c, nil, noJournalError, got.events())
	drive(t, st, txn, nil)
	if got.saved == 0 || got.saved+got.skipped[NoSpace] != len(c) || got.skipped[Failure] != 0 {
		t.Fatalf("saved %d, skipped %v", got.saved, got.skipped)
	}
	settledClean(t, st)
}

// TestBudgetCut: a save over the scheduler's budget is cut: the run it
// admitted in part is reallocated for the blocks admitted, its tail and
// every later run are given up as Budget, and what was admitted commits.
func TestBudgetCut(t *testing.T) {
	budget := 3 * geo.ChunkBytes()
	st := newStore(t, 1, 64<<20, budget)
	c := chain(400, 8)
	var got tally
	txn := Admit(st, c, nil, noJournalError, got.events())
	drive(t, st, txn, nil)
	if got.saved == 0 || got.saved >= len(c) || got.saved+got.skipped[Budget] != len(c) {
		t.Fatalf("saved %d, skipped %v (budget of %d blocks)", got.saved, got.skipped, budget/geo.ChunkBytes())
	}
	if n := local(st).Index.Lookup(c); n != got.saved {
		t.Fatalf("%d blocks served, %d saved", n, got.saved)
	}
	settledClean(t, st)
}

// TestCommitFailure: a commit that fails (the map closed under it) gives
// up its runs and every later one as a Failure.
func TestCommitFailure(t *testing.T) {
	st := newStore(t, 1, 64<<20, 0)
	c := chain(500, 4)
	var got tally
	txn := Admit(st, c, nil, noJournalError, got.events())
	if err := local(st).Map.Close(); err != nil {
		t.Fatal(err)
	}
	drive(t, st, txn, nil)
	if got.saved != 0 || got.skipped[Failure] != len(c) || len(got.errs) != 1 || !errors.Is(got.errs[0], objmap.ErrClosed) {
		t.Fatalf("saved %d, skipped %v, errors %v", got.saved, got.skipped, got.errs)
	}
	if p := local(st).Index.Stats().Pending; p != 0 {
		t.Errorf("%d blocks left pending in the index", p)
	}
}

// TestDrainingRun: a run given up while its writes are still to come
// (run 0 failed, settled before run 1 was written) drains: its writes are
// retired without I/O, and its pool reservation is released once they all
// are.
func TestDrainingRun(t *testing.T) {
	st := newStore(t, 2, 64<<20, 0)
	c := chain(600, 8)
	var got tally
	txn := Admit(st, c, nil, noJournalError, got.events())
	eio := errors.New("EIO")
	writes := 0
	driveSettling(t, st, txn, func(run int, io sched.IO) error {
		writes++
		if run == 0 {
			return eio
		}
		return nil
	}, true)
	if got.saved != 0 || got.skipped[Failure] != len(c) || len(got.errs) != 1 {
		t.Fatalf("saved %d, skipped %v, errors %v", got.saved, got.skipped, got.errs)
	}
	if writes >= txn.Writes() {
		t.Fatalf("%d of %d writes went to disk: the given-up run's were not skipped", writes, txn.Writes())
	}
	settledClean(t, st)
}

// local is st's control path, the store's own parts.
func local(st *Store) *Local { return st.Ctl.(*Local) }
