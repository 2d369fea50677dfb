package runtime

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tutti-io/tutti/kvevents"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime/internal/kvmeta"
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

	first := cfg.Dirs[0] // the sidecar's directory, whatever order a reopen lists
	for _, tc := range []struct {
		name     string
		prepare  func()
		hashOnly bool
	}{
		{"sidecar", func() {}, false},
		{"torn sidecar tail", func() {
			p := filepath.Join(first, kvmeta.FileName)
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			// A record of the head, then a torn one appended by a crash.
			if err := os.WriteFile(p, append(b, 9, 0, 0, 0, 1, 2), 0o644); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"directories listed the other way", func() { cfg.Dirs = []string{cfg.Dirs[1], cfg.Dirs[0]} }, false},
		{"no sidecar", func() {
			if err := os.Remove(filepath.Join(first, kvmeta.FileName)); err != nil {
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
