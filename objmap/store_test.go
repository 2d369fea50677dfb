package objmap

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/uring"
)

// tinyGeom has objects smaller than a block (2 KiB per chunk per layer), so
// padding is exercised: a run of n chunks is 4096 (header) + 4096 (chunk
// table) + 2*alignUp(2048n) bytes.
var tinyGeom = kvshape.Geometry{Layers: 2, KVHeads: 1, HeadDim: 64, DType: kvshape.FP16, Planes: 2, PageTokens: 4, ChunkPages: 2}

func testOpts(t *testing.T, dirs ...string) Options {
	t.Helper()
	if len(dirs) == 0 {
		dirs = []string{filepath.Join(t.TempDir(), "d0")}
	}
	return Options{Dirs: dirs, CapacityBytes: 1 << 20, Geometry: tinyGeom}
}

func mustOpen(t *testing.T, o Options) *Map {
	t.Helper()
	m, err := Open(o)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return m
}

// payload is the deterministic content of layer l of run id: what the test
// writes and what it expects back.
func payload(g kvshape.Geometry, id RunID, chunks, layer int) []byte {
	b := make([]byte, ObjectBytes(g, chunks))
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], uint64(id)*1_000_003+uint64(layer)*7919+uint64(i))
	}
	return b
}

func chainFor(id RunID, chunks int) []uint64 {
	c := make([]uint64, chunks)
	for i := range c {
		c[i] = uint64(id)<<20 | uint64(i)
	}
	return c
}

// writeRun writes every object of r (with O_DIRECT from off-heap memory, as
// the runtime does) and returns its commit request.
func writeRun(t *testing.T, m *Map, r Reservation) CommitRequest {
	t.Helper()
	g := m.Geometry()
	stride := ObjectStride(g, r.Chunks)
	buf, err := uring.AllocBuffer(int(stride))
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	req := CommitRequest{Res: r, Chain: chainFor(r.ID, r.Chunks), Parent: uint64(r.ID) * 3, HasParent: r.ID%2 == 0}
	for l := 0; l < g.Layers; l++ {
		p := payload(g, r.ID, r.Chunks, l)
		clear(buf.Bytes())
		copy(buf.Bytes(), p)
		obj, err := m.Layout().Where(r.Place(), l, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := pwriteAll(int(m.Files()[obj.File].FD), buf.Bytes(), obj.Offset); err != nil {
			t.Fatalf("writing run %d layer %d: %v", r.ID, l, err)
		}
		cb := int(g.ChunkBytesPerLayer())
		for c := 0; c < r.Chunks; c++ {
			req.ChunkCRCs = append(req.ChunkCRCs, CRC32C(p[c*cb:(c+1)*cb]))
		}
	}
	return req
}

// save allocates, writes and commits chunks chunks; it returns the runs.
func save(t *testing.T, m *Map, chunks int) []RunInfo {
	t.Helper()
	res, err := m.Allocate(chunks)
	if err != nil {
		t.Fatalf("allocate %d: %v", chunks, err)
	}
	var reqs []CommitRequest
	for _, r := range res {
		reqs = append(reqs, writeRun(t, m, r))
	}
	if err := m.Commit(reqs); err != nil {
		t.Fatalf("commit: %v", err)
	}
	var out []RunInfo
	for _, r := range res {
		info, ok := m.Lookup(r.ID)
		if !ok {
			t.Fatalf("run %d not served after commit", r.ID)
		}
		out = append(out, info)
	}
	return out
}

// readBack reads the first k chunks of layer l of run r with one read (as
// the runtime does) and compares them with what was written.
func readBack(t *testing.T, m *Map, r RunInfo, layer, k int) {
	t.Helper()
	g := m.Geometry()
	sp, err := m.Layout().Span(r.Place(), layer, 0, k)
	if err != nil {
		t.Fatal(err)
	}
	ioBytes, data := sp.IOBytes, sp.DataBytes
	buf, err := uring.AllocBuffer(int(ioBytes))
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	if err := preadFull(int(m.Files()[sp.File].FD), buf.Bytes(), sp.Off); err != nil {
		t.Fatal(err)
	}
	want := payload(g, r.ID, r.Chunks(), layer)[:data]
	if !bytes.Equal(buf.Bytes()[:data], want) {
		t.Fatalf("run %d layer %d first %d chunks differ", r.ID, layer, k)
	}
	if ioBytes != alignUp(int64(k)*g.ChunkBytesPerLayer()) {
		t.Fatalf("run %d layer %d first %d chunks: %d bytes read, more than the chunks", r.ID, layer, k, ioBytes)
	}
	if err := r.VerifySpan(sp, buf.Bytes()); err != nil {
		t.Fatalf("run %d layer %d first %d chunks: %v", r.ID, layer, k, err)
	}
}

func TestStoreRoundTripAndReopen(t *testing.T) {
	dirs := []string{filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")}
	o := testOpts(t, dirs...)
	o.FilesPerDir = 2
	m := mustOpen(t, o)
	var runs []RunInfo
	for i := 1; i <= 6; i++ {
		runs = append(runs, save(t, m, i)...)
	}
	// Striped round-robin: consecutive runs land in different directories.
	for i := 1; i < len(runs); i++ {
		if runs[i].File%2 == runs[i-1].File%2 {
			t.Fatalf("runs %d and %d both in directory %d", runs[i-1].ID, runs[i].ID, runs[i].File%2)
		}
	}
	for _, r := range runs {
		readBack(t, m, r, 1, r.Chunks())
	}
	if err := m.Free(runs[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Lookup(runs[0].ID); ok {
		t.Fatal("freed run still served")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}

	// Reopen with the directories in the other order and no geometry: both
	// come from the manifests.
	m = mustOpen(t, Options{Dirs: []string{dirs[1], dirs[0]}})
	defer m.Close()
	rep := m.Recovery()
	if rep.Objects != 5 || rep.Recovered != 5 || rep.Dropped != 0 || rep.Epoch != 2 {
		t.Fatalf("report: %v", rep)
	}
	for _, r := range runs[1:] {
		got, ok := m.Lookup(r.ID)
		if !ok {
			t.Fatalf("run %d lost", r.ID)
		}
		if got.Generation != 1 || got.HasParent != (r.ID%2 == 0) || got.Parent != uint64(r.ID)*3 {
			t.Fatalf("run %d: generation %d parent %d (%v)", r.ID, got.Generation, got.Parent, got.HasParent)
		}
		if len(got.LayerCRCs) != tinyGeom.Layers || got.LayerCRCs[1] != CRC32C(payload(tinyGeom, r.ID, r.Chunks(), 1)) {
			t.Fatalf("run %d: LayerCRCs %v", r.ID, got.LayerCRCs)
		}
		if !slices.Equal(got.ChunkCRCs, r.ChunkCRCs) || len(got.ChunkCRCs) != tinyGeom.Layers*r.Chunks() {
			t.Fatalf("run %d: recovered ChunkCRCs %v, committed %v", r.ID, got.ChunkCRCs, r.ChunkCRCs)
		}
		readBack(t, m, got, 0, 1)
		readBack(t, m, got, 1, got.Chunks())
	}
	rep, err := m.Check()
	if err != nil || rep.Corrupt != 0 {
		t.Fatalf("check: %v %v", rep, err)
	}
	// New runs never reuse an id and carry the new generation.
	nr := save(t, m, 1)
	if nr[0].ID <= runs[len(runs)-1].ID || nr[0].Generation != 2 {
		t.Fatalf("new run %+v", nr[0])
	}
}

func TestStorePermissionsAndLock(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s")
	m := mustOpen(t, testOpts(t, dir))
	save(t, m, 2)
	st, err := os.Stat(dir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("dir mode %v %v", st.Mode(), err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		info, _ := e.Info()
		if info.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s is %v, want owner-only", e.Name(), info.Mode().Perm())
		}
	}
	_, err = Open(testOpts(t, dir))
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("second open: %v", err)
	}
	_, err = Open(Options{Dirs: []string{dir}, ReadOnly: true})
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("fsck while open: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m = mustOpen(t, testOpts(t, dir))
	m.Close()
}

func TestStoreLockOtherProcess(t *testing.T) {
	if os.Getenv("OBJMAP_LOCK_CHILD") != "" {
		m, err := Open(Options{Dirs: []string{os.Getenv("OBJMAP_LOCK_CHILD")}})
		fmt.Print(err)
		if err == nil {
			m.Close()
		}
		os.Exit(0)
	}
	dir := filepath.Join(t.TempDir(), "s")
	m := mustOpen(t, testOpts(t, dir))
	defer m.Close()
	exe, _ := os.Executable()
	out, err := runChild(exe, "-test.run=^TestStoreLockOtherProcess$", "OBJMAP_LOCK_CHILD="+dir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "locked") || !strings.Contains(out, fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("child got %q", out)
	}
}

func TestStoreOpenErrors(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s")
	m := mustOpen(t, testOpts(t, dir))
	m.Close()
	o := testOpts(t, dir)
	o.Geometry.HeadDim = 128
	if _, err := Open(o); !errors.Is(err, ErrGeometryMismatch) {
		t.Fatalf("other geometry: %v", err)
	}
	o = testOpts(t, dir)
	o.CapacityBytes = 2 << 20
	if _, err := Open(o); !errors.Is(err, ErrSettingsMismatch) || !strings.Contains(err.Error(), "CapacityBytes") {
		t.Fatalf("other capacity: %v", err)
	}
	o = testOpts(t)
	o.Geometry.Planes = 3
	if _, err := Open(o); !errors.Is(err, kvshape.ErrGeometry) {
		t.Fatalf("bad geometry: %v", err)
	}
}

func TestAllocatePartialAndAbort(t *testing.T) {
	m := mustOpen(t, testOpts(t))
	defer m.Close()
	total := m.Stats().FreeBytes
	res, err := m.Allocate(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for _, r := range res {
		if r.Chunks > m.MaxRunChunks() {
			t.Fatalf("run of %d chunks", r.Chunks)
		}
		got += r.Chunks
	}
	if got == 0 || got >= 1<<20 {
		t.Fatalf("partial allocation gave %d chunks", got)
	}
	if _, err := m.Allocate(1); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("full pool: %v", err)
	}
	for _, r := range res {
		if err := m.Abort(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Abort(res[0]); !errors.Is(err, ErrUnknownRun) {
		t.Fatalf("double abort: %v", err)
	}
	if s := m.Stats(); s.FreeBytes != total || s.ReservedBytes != 0 {
		t.Fatalf("after abort: %+v", s)
	}
}

func TestFreeQuarantineUntilDurable(t *testing.T) {
	o := testOpts(t)
	m := mustOpen(t, o)
	defer m.Close()
	// Fill the pool, free one run: its space is not allocatable until the
	// free record is durable.
	var runs []RunInfo
	for {
		res, err := m.Allocate(1)
		if errors.Is(err, ErrNoSpace) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Commit([]CommitRequest{writeRun(t, m, res[0])}); err != nil {
			t.Fatal(err)
		}
		r, _ := m.Lookup(res[0].ID)
		runs = append(runs, r)
	}
	if err := m.Free(runs[3].ID); err != nil {
		t.Fatal(err)
	}
	if s := m.Stats(); s.QuarantinedBytes != runs[3].Length {
		t.Fatalf("quarantined %d", s.QuarantinedBytes)
	}
	if _, err := m.Allocate(1); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("reused quarantined space: %v", err)
	}
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	res, err := m.Allocate(1)
	if err != nil || res[0].Offset != runs[3].Offset || res[0].File != runs[3].File {
		t.Fatalf("after sync: %v %v", res, err)
	}
}

func TestCommitRejects(t *testing.T) {
	m := mustOpen(t, testOpts(t))
	defer m.Close()
	res, _ := m.Allocate(2)
	req := writeRun(t, m, res[0])
	bad := req
	bad.Chain = bad.Chain[:1]
	if err := m.Commit([]CommitRequest{bad}); err == nil {
		t.Fatal("short chain committed")
	}
	for name, mut := range map[string]func(r *CommitRequest){
		"no CRCs":           func(r *CommitRequest) { r.ChunkCRCs = nil },
		"short chunk CRCs":  func(r *CommitRequest) { r.ChunkCRCs = r.ChunkCRCs[1:] },
		"short layer CRCs":  func(r *CommitRequest) { r.LayerCRCs = []uint32{1} },
		"layer CRCs differ": func(r *CommitRequest) { r.LayerCRCs = make([]uint32, tinyGeom.Layers) },
	} {
		res, _ := m.Allocate(2)
		bad := writeRun(t, m, res[0])
		mut(&bad)
		if err := m.Commit([]CommitRequest{bad}); err == nil {
			t.Fatalf("%s: committed", name)
		}
	}
	if err := m.Commit([]CommitRequest{req, req}); err == nil {
		t.Fatal("double commit in one call")
	}
	if err := m.Commit([]CommitRequest{req}); err != nil {
		t.Fatal(err)
	}
	if err := m.Commit([]CommitRequest{req}); !errors.Is(err, ErrUnknownRun) {
		t.Fatalf("second commit: %v", err)
	}
	if err := m.Free(RunID(999)); !errors.Is(err, ErrUnknownRun) {
		t.Fatalf("free unknown: %v", err)
	}
}

// corruptHeader rewrites a run's header in place with mut applied.
func corruptHeader(t *testing.T, dir string, file int, off int64, mut func(h *Header)) {
	t.Helper()
	path := filepath.Join(dir, poolFileName(file))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, HeaderBytes)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	h, err := DecodeHeader(b)
	if err != nil {
		t.Fatal(err)
	}
	mut(&h)
	if err := EncodeHeader(b, &h); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func TestRecoveryDropsBadHeaders(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s")
	m := mustOpen(t, testOpts(t, dir))
	var runs []RunInfo
	for i := 0; i < 5; i++ {
		runs = append(runs, save(t, m, 1+i%3)...)
	}
	m.Close()
	// run 0: header overwritten by another run's bytes (zeros here).
	f, _ := os.OpenFile(filepath.Join(dir, poolFileName(0)), os.O_RDWR, 0)
	f.WriteAt(make([]byte, HeaderBytes), runs[0].Offset)
	f.Close()
	// run 1: a valid header of another generation.
	corruptHeader(t, dir, runs[1].File, runs[1].Offset, func(h *Header) { h.Generation = 99 })
	// run 2: a valid header naming another run.
	corruptHeader(t, dir, runs[2].File, runs[2].Offset, func(h *Header) { h.RunID = 12345 })
	// run 3: payload corrupted (header fine): only Check finds it.
	layer1, _ := objectOffset1(tinyGeom, runs[3].Chunks(), 1)
	f, _ = os.OpenFile(filepath.Join(dir, poolFileName(0)), os.O_RDWR, 0)
	f.WriteAt([]byte{0xff, 0xfe}, runs[3].Offset+layer1+10)
	f.Close()

	m = mustOpen(t, testOpts(t, dir))
	rep := m.Recovery()
	t.Log(rep)
	if rep.Objects != 5 || rep.Recovered != 2 || rep.Dropped != 3 || rep.Corrupt != 0 {
		t.Fatalf("report: %v", rep)
	}
	wantReason := map[RunID]string{runs[0].ID: "bad magic", runs[1].ID: "generation 99, journal 1", runs[2].ID: "run id 12345"}
	for _, p := range rep.DroppedRuns {
		if !strings.Contains(p.Reason, wantReason[p.Run]) {
			t.Errorf("run %d dropped because %q, want %q", p.Run, p.Reason, wantReason[p.Run])
		}
	}
	for _, r := range runs[:3] {
		if _, ok := m.Lookup(r.ID); ok {
			t.Fatalf("dropped run %d served", r.ID)
		}
	}
	crep, err := m.Check()
	if err != nil || crep.Corrupt != 1 || crep.CorruptRuns[0].Run != runs[3].ID || !strings.Contains(crep.CorruptRuns[0].Reason, "layer 1 chunk 0: CRC32C") {
		t.Fatalf("check: %v %v", crep, err)
	}
	// The dropped runs' space is free again, and their frees were journaled:
	// the next open does not see them at all.
	m.Close()
	m = mustOpen(t, testOpts(t, dir))
	defer m.Close()
	if rep := m.Recovery(); rep.Objects != 2 || rep.Dropped != 0 {
		t.Fatalf("second reopen: %v", rep)
	}
}

func TestRecoveryTornJournalTail(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s")
	m := mustOpen(t, testOpts(t, dir))
	save(t, m, 2)
	save(t, m, 3)
	m.Close()
	seg := filepath.Join(dir, segmentName(1))
	st, _ := os.Stat(seg)
	// Append half of a commit record of a run that never committed, plus garbage.
	rec, _ := AppendRecord(nil, &Record{Type: RecCommit, Run: RunInfo{ID: 50, Generation: 2, File: 0, Offset: 0, Length: runBytes1(tinyGeom, 1), Chain: []uint64{1}}})
	f, _ := os.OpenFile(seg, os.O_WRONLY|os.O_APPEND, 0)
	f.Write(rec[:len(rec)-5])
	f.Close()

	m = mustOpen(t, testOpts(t, dir))
	rep := m.Recovery()
	if rep.Recovered != 2 || rep.JournalTailBytes != int64(len(rec)-5) {
		t.Fatalf("report: %v", rep)
	}
	if _, ok := m.Lookup(50); ok {
		t.Fatal("torn commit served")
	}
	// The tail was truncated: new records follow the good ones.
	save(t, m, 1)
	m.Close()
	if st2, _ := os.Stat(seg); st2.Size() <= st.Size() {
		t.Fatalf("segment did not grow past the truncated tail")
	}
	m = mustOpen(t, testOpts(t, dir))
	defer m.Close()
	if rep := m.Recovery(); rep.Recovered != 3 || rep.JournalTailBytes != 0 {
		t.Fatalf("after truncation: %v", rep)
	}
}

func TestCheckpointAndReplay(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s")
	o := testOpts(t, dir)
	o.SegmentBytes = 4096
	m := mustOpen(t, o)
	live := map[RunID]RunInfo{}
	for i := 0; i < 60; i++ {
		for _, r := range save(t, m, 1+i%4) {
			live[r.ID] = r
		}
		if i%3 == 2 {
			for id := range live {
				if err := m.Free(id); err != nil {
					t.Fatal(err)
				}
				delete(live, id)
				break
			}
		}
	}
	s := m.Stats()
	if s.Checkpoints == 0 {
		t.Fatalf("no checkpoint with 4 KiB segments: %+v", s)
	}
	m.Close()
	segs, _ := filepath.Glob(filepath.Join(dir, "journal-*.log"))
	if len(segs) != 1 {
		t.Fatalf("segments left: %v", segs)
	}
	m = mustOpen(t, o)
	defer m.Close()
	rep := m.Recovery()
	if rep.CheckpointRuns == 0 || rep.Recovered != len(live) || rep.Dropped != 0 {
		t.Fatalf("report: %v (want %d live)", rep, len(live))
	}
	n := 0
	m.Runs(func(r RunInfo) bool {
		if _, ok := live[r.ID]; !ok {
			t.Errorf("run %d served, not live", r.ID)
		}
		n++
		return true
	})
	if n != len(live) {
		t.Fatalf("%d runs served, %d live", n, len(live))
	}
	if rep, err := m.Check(); err != nil || rep.Corrupt != 0 {
		t.Fatalf("check %v %v", rep, err)
	}
}

func TestReadOnlyDoesNotWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s")
	m := mustOpen(t, testOpts(t, dir))
	save(t, m, 2)
	m.Close()
	seg := filepath.Join(dir, segmentName(1))
	f, _ := os.OpenFile(seg, os.O_WRONLY|os.O_APPEND, 0)
	f.Write([]byte{1, 2, 3})
	f.Close()
	before, _ := os.ReadFile(seg)
	m = mustOpen(t, Options{Dirs: []string{dir}, ReadOnly: true})
	if rep := m.Recovery(); rep.Recovered != 1 || rep.JournalTailBytes != 3 {
		t.Fatalf("report %v", rep)
	}
	if _, err := m.Allocate(1); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("allocate read-only: %v", err)
	}
	m.Close()
	after, _ := os.ReadFile(seg)
	if !bytes.Equal(before, after) {
		t.Fatal("read-only open changed the journal")
	}
}
