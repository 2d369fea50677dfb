package objmap

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
)

// Fuzz targets for the files recovery reads besides headers and single
// records (FuzzHeaderDecode, FuzzChunkTableDecode, FuzzJournalDecode,
// FuzzReplay): the MANIFEST, the checkpoint and a journal segment as a
// whole. Seeds are in testdata/fuzz/<target>; CI runs only the seeds.

func sampleManifest() []byte {
	m := manifest{Version: manifestVersion, StoreID: "00112233445566778899aabbccddeeff", DirIndex: 0, Dirs: 1,
		Geometry: tinyGeom, FilesPerDir: 1, FileBytes: 1 << 20, CapacityBytes: 1 << 20}
	m.Fingerprint = fingerprintHex(tinyGeom)
	b, _ := json.MarshalIndent(&m, "", "  ")
	return b
}

func fingerprintHex(g kvshape.Geometry) string {
	const hexd = "0123456789abcdef"
	fp := Fingerprint(g)
	out := make([]byte, 16)
	for i := 15; i >= 0; i-- {
		out[i] = hexd[fp&15]
		fp >>= 4
	}
	return string(out)
}

// FuzzManifest: parseManifest never panics, and what it accepts is within
// Open's bounds and survives a write and a read unchanged.
func FuzzManifest(f *testing.F) {
	f.Add(sampleManifest())
	f.Add([]byte(`{"version":1,"dirs":300,"dir_index":0}`))
	f.Add([]byte(`{"version":1,"dirs":1,"files_per_dir":1,"file_bytes":-4096}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := parseManifest(data)
		if err != nil {
			return
		}
		if m.Dirs > maxDirs || m.FilesPerDir > maxFilesPerDir || m.FileBytes > maxFileBytes || checkGeometry(m.Geometry) != nil {
			t.Fatalf("accepted out-of-bounds manifest %+v", m)
		}
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := parseManifest(b)
		if err != nil || *m2 != *m {
			t.Fatalf("manifest does not round-trip: %v %+v %+v", err, m, m2)
		}
	})
}

func sampleCheckpoint() []byte {
	runs := []RunInfo{
		{ID: 3, Generation: 1, File: 0, Offset: 0, Length: runBytes1(tinyGeom, 1), Chain: []uint64{7}, Kept: 1},
		{ID: 9, Generation: 2, File: 1, Offset: 8192, Length: runBytes1(tinyGeom, 3), Chain: []uint64{1, 2, 3}, Parent: 5, HasParent: true, Kept: 2},
		{ID: 12, Generation: 2, File: 0, Offset: 1 << 20, Length: runBytes1(tinyGeom, 2), Chain: []uint64{8, 9}, Kept: 1},
	}
	b, _ := encodeCheckpoint(4, 2, 10, runs)
	return b
}

// FuzzCheckpoint: parseCheckpoint never panics, never returns more runs
// than its bound, and a checkpoint it accepts (with runs in id order, as
// one is written) encodes back to the same bytes.
func FuzzCheckpoint(f *testing.F) {
	cp := sampleCheckpoint()
	f.Add(cp)
	f.Add(cp[:len(cp)-1])
	f.Add(append(slices.Clone(cp), 0))
	f.Fuzz(func(t *testing.T, data []byte) {
		const maxRuns = 64
		runs, head, err := parseCheckpoint(data, maxRuns)
		if err != nil {
			return
		}
		if len(runs) > maxRuns || uint64(len(runs)) != head.Count {
			t.Fatalf("%d runs, head says %d, bound %d", len(runs), head.Count, maxRuns)
		}
		if !slices.IsSortedFunc(runs, func(a, b RunInfo) int { return cmpID(a.ID, b.ID) }) {
			return
		}
		b, err := encodeCheckpoint(head.Seq, head.Epoch, head.NextID, runs)
		if err != nil || !bytes.Equal(b, data) {
			t.Fatalf("checkpoint does not round-trip: %v", err)
		}
	})
}

func sampleSegment() []byte {
	b, _ := AppendRecord(nil, &Record{Type: RecSegment, Seq: 1})
	b, _ = AppendRecord(b, &Record{Type: RecEpoch, Epoch: 1})
	b, _ = AppendRecord(b, &Record{Type: RecCommit, Run: RunInfo{ID: 1, Generation: 1, Length: runBytes1(tinyGeom, 2), Chain: []uint64{4, 5}}})
	b, _ = AppendRecord(b, &Record{Type: RecTrim, ID: 1, Keep: 1})
	b, _ = AppendRecord(b, &Record{Type: RecFree, ID: 1})
	return b
}

// FuzzSegment: replaying any bytes as journal segment 1 never panics, and
// its verdict is consistent: a torn tail starts at the end of the good
// records and holds no valid record; without damage every good byte was a
// record that was applied.
func FuzzSegment(f *testing.F) {
	s := sampleSegment()
	f.Add(s)
	f.Add(s[:len(s)-4])
	f.Add(append(slices.Clone(s), make([]byte, 40)...))
	flipped := slices.Clone(s)
	flipped[30] ^= 1
	f.Add(flipped)
	f.Fuzz(func(t *testing.T, data []byte) {
		js := newJournalState()
		js.seg = "journal-1"
		js.replaySegment(data, 4096)
		if js.damage != "" || js.markerTorn {
			return
		}
		if js.segGood+js.tailBytes != int64(len(data)) {
			t.Fatalf("good %d + tail %d != %d bytes", js.segGood, js.tailBytes, len(data))
		}
		if js.tailBytes > 4096 {
			t.Fatalf("torn tail of %d bytes, bound 4096", js.tailBytes)
		}
		if js.tailBytes > 0 {
			if _, _, found, _ := findRecord(data, int(js.segGood)+1); found {
				t.Fatal("a torn tail holds a valid record")
			}
		}
		for p, n := 0, 0; p < int(js.segGood); p += n {
			var err error
			if _, n, err = DecodeRecord(data[p:]); err != nil {
				t.Fatalf("good bytes hold a bad record at %d: %v", p, err)
			}
		}
	})
}
