package objmap

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzReplay builds a journal of well-formed records (valid CRCs) whose
// contents come from the fuzzer: runs in files that do not exist, at
// unaligned or overlapping offsets, of wrong lengths, frees of unknown runs,
// duplicate commits, stray segment and checkpoint records. Recovery must
// never panic; it either refuses the store as corrupt or serves only runs
// whose extent is sane and whose header verifies, with free + live bytes =
// capacity.
func FuzzReplay(f *testing.F) {
	f.Add([]byte{1, 1, 0, 0, 1, 1, 2, 0, 2, 1})
	f.Add([]byte{1, 1, 0, 0, 1, 1, 1, 0, 0, 1})
	f.Add([]byte{1, 5, 9, 3, 200, 1, 3, 7, 4, 1, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := filepath.Join(t.TempDir(), "s")
		o := Options{Dirs: []string{dir}, CapacityBytes: 256 << 10, Geometry: tinyGeom}
		m, err := Open(o)
		if err != nil {
			t.Fatal(err)
		}
		// One real run, so some records can point at a valid header.
		res, err := m.Allocate(2)
		if err != nil {
			t.Fatal(err)
		}
		req := writeRun(t, m, res[0])
		if err := m.Commit([]CommitRequest{req}); err != nil {
			t.Fatal(err)
		}
		real, _ := m.Lookup(res[0].ID)
		m.Close()

		var tail []byte
		for len(data) >= 5 {
			kind, a, b, c, d := data[0]%6, data[1], data[2], data[3], data[4]
			data = data[5:]
			var r Record
			switch kind {
			case 0, 1: // commit: sometimes a copy of the real run, sometimes made up
				run := real
				if kind == 1 {
					chunks := 1 + int(c%8)
					run = RunInfo{ID: RunID(a % 8), Generation: uint64(d % 3), File: int(b % 3),
						Offset: int64(binary.LittleEndian.Uint16([]byte{c, d})) * 512,
						Length: runBytes1(tinyGeom, chunks) + int64(a%2)*4096, Chain: make([]uint64, chunks)}
				}
				r = Record{Type: RecCommit, Run: run}
			case 2:
				r = Record{Type: RecFree, ID: RunID(a % 8)}
			case 3:
				r = Record{Type: RecEpoch, Epoch: uint64(a)}
			case 4:
				r = Record{Type: RecSegment, Seq: uint64(a)}
			case 5:
				r = Record{Type: RecCheckpointEnd, Count: uint64(a)}
			}
			tail, _ = AppendRecord(tail, &r)
		}
		seg := filepath.Join(dir, segmentName(1))
		fh, err := os.OpenFile(seg, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		fh.Write(tail)
		fh.Close()

		m, err = Open(Options{Dirs: []string{dir}, ReadOnly: true})
		if err != nil {
			if !errors.Is(err, ErrCorruptStore) {
				t.Fatalf("open: %v", err)
			}
			return
		}
		defer m.Close()
		rep := m.Recovery()
		if rep.Recovered+rep.Dropped != rep.Objects {
			t.Fatalf("report does not add up: %v", rep)
		}
		var live int64
		runs := 0
		m.Runs(func(r RunInfo) bool { live += r.Length; runs++; return true })
		if s := m.Stats(); s.FreeBytes+live != s.CapacityBytes || s.LiveRuns != runs {
			t.Fatalf("free %d + live %d != capacity %d, or %d live runs counted, %d listed", s.FreeBytes, live, s.CapacityBytes, s.LiveRuns, runs)
		}
		if c, err := m.Check(); err != nil || c.Corrupt != 0 {
			t.Fatalf("a served run is corrupt: %v %v", c, err)
		}
	})
}
