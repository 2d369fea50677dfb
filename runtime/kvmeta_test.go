package runtime

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tutti-io/tutti/kvevents"
	"github.com/tutti-io/tutti/kvshape"
)

// TestKVEventsRestart: a reopened store publishes AllBlocksCleared in a new
// epoch, then what it recovered, parents first, with the token ids the
// engine gave before the restart (from the sidecar); without the sidecar,
// hashes only, and it says so.
func TestKVEventsRestart(t *testing.T) {
	g := tinyGeometry()
	rng := rand.New(rand.NewPCG(9, 9))
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 64)
	cfg.KVEvents = evConfig()
	s, kv := openKV(t, cfg)
	head := chainOf(1<<40, 3)
	full := append(slices.Clone(head), chainOf(2<<40, 3)...)
	for _, ch := range [][]uint64{head, full} {
		pages := pageTable(rng, g, cfg.NumPages, len(ch))
		fill(kv, g, ch, pages)
		sv, err := s.SaveWithMeta(ch, pages, metaOf(g, ch))
		if err != nil {
			t.Fatal(err)
		}
		sv.Wait()
	}
	st0 := s.Stats().Events
	closeKV(t, s, kv)

	for _, tc := range []struct {
		name     string
		prepare  func()
		hashOnly bool
	}{
		{"sidecar", func() {}, false},
		{"torn sidecar tail", func() {
			p := filepath.Join(cfg.Dirs[0], kvmetaName)
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			// A record of the head, then a torn one appended by a crash.
			if err := os.WriteFile(p, append(b, 9, 0, 0, 0, 1, 2), 0o644); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"no sidecar", func() {
			if err := os.Remove(filepath.Join(cfg.Dirs[0], kvmetaName)); err != nil {
				t.Fatal(err)
			}
		}, true},
	} {
		tc.prepare()
		s, kv := openKV(t, cfg)
		st := s.Stats().Events
		if st.Epoch == st0.Epoch {
			t.Fatalf("%s: epoch %d unchanged across the restart", tc.name, st.Epoch)
		}
		batches := replayAll(t, s)
		held := history(t, batches)
		if len(held) != len(full) {
			t.Fatalf("%s: published %d recovered blocks, want %d", tc.name, len(held), len(full))
		}
		var tokens int
		for _, b := range batches {
			for _, e := range b.b.Events {
				tokens += len(e.Tokens)
				if e.Kind == kvevents.BlockStored && len(e.Tokens) > 0 && !slices.Equal(e.Tokens[:8], tokensOf(g, e.Hashes[0].Uint())) {
					t.Fatalf("%s: block %v published with tokens %v", tc.name, e.Hashes[0], e.Tokens[:8])
				}
			}
		}
		if wantTokens := len(full) * 8; (tokens == wantTokens) == tc.hashOnly || (tc.hashOnly && tokens != 0) {
			t.Fatalf("%s: %d token ids published, want %d", tc.name, tokens, wantTokens)
		}
		if st := s.Stats().Events; (st.HashOnlyBlocks > 0) != tc.hashOnly {
			t.Fatalf("%s: %d blocks counted hashes only", tc.name, st.HashOnlyBlocks)
		} else if tc.name == "torn sidecar tail" && st.MetaLoadNote == "" {
			t.Fatalf("%s: the torn tail was not noted", tc.name)
		}
		closeKV(t, s, kv)
	}
}

func TestKVMetaRecordRoundTrip(t *testing.T) {
	ids := []uint64{1, 2, 3}
	ms := []blockMeta{{tokens: []uint32{1, 2, 3, 4}}, {hash: []byte{9, 9}}, {tokens: []uint32{5, 6, 7, 8}, hash: []byte{1}}}
	p := appendMetaRecord(kvmetaHeaderBytes(4), ids, ms)
	var got []metaRecord
	good, stop, err := parseKVMeta(p, 4, func(r metaRecord) { got = append(got, r) })
	if err != nil || stop != nil || good != len(p) || len(got) != 1 {
		t.Fatalf("parse: good %d of %d, stop %v, err %v, %d records", good, len(p), stop, err, len(got))
	}
	for i := range ids {
		if got[0].ids[i] != ids[i] || !slices.Equal(got[0].metas[i].tokens, ms[i].tokens) || !slices.Equal(got[0].metas[i].hash, ms[i].hash) {
			t.Fatalf("block %d: %+v", i, got[0].metas[i])
		}
	}
	if _, _, err := parseKVMeta(p, 8, func(metaRecord) {}); err == nil {
		t.Fatal("a sidecar of another block size was read")
	}
	for cut := kvmetaHeader + 1; cut < len(p); cut++ {
		n := 0
		if _, stop, _ := parseKVMeta(p[:cut], 4, func(metaRecord) { n++ }); stop == nil || n != 0 {
			t.Fatalf("cut at %d: stop %v, %d records", cut, stop, n)
		}
	}
}

func FuzzParseKVMeta(f *testing.F) {
	f.Add(appendMetaRecord(kvmetaHeaderBytes(4), []uint64{1}, []blockMeta{{tokens: []uint32{1, 2, 3, 4}, hash: []byte{7}}}))
	f.Add(kvmetaHeaderBytes(4))
	f.Fuzz(func(t *testing.T, p []byte) {
		good, _, err := parseKVMeta(p, 4, func(r metaRecord) {
			if len(r.ids) != len(r.metas) || len(r.ids) == 0 || len(r.ids) > kvmetaMaxRecordBlocks {
				t.Fatalf("record of %d ids, %d metas", len(r.ids), len(r.metas))
			}
			for _, m := range r.metas {
				if len(m.tokens) != 0 && len(m.tokens) != 4 || len(m.hash) > kvevents.MaxHashBytes {
					t.Fatalf("meta %+v out of bounds", m)
				}
			}
		})
		if err == nil && (good < kvmetaHeader || good > len(p)) {
			t.Fatalf("good %d of %d", good, len(p))
		}
	})
}
