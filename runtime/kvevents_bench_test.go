package runtime

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tutti-io/tutti/kvevents"
	"github.com/tutti-io/tutti/kvshape"
)

// BenchmarkKVEventsCommitToSubscriber: per op, a one-block save waited for
// (its commit is durable and served), then the time until a subscriber on
// 127.0.0.1 holds the block. save-ns is the baseline of the same run.
func BenchmarkKVEventsCommitToSubscriber(b *testing.B) {
	g := tinyGeometry()
	cfg := testConfig(b, g, kvshape.LayoutPerLayer, 64)
	cfg.KVEvents = evConfig()
	s, kv := openKV(b, cfg)
	defer closeKV(b, s, kv)
	st := s.Stats().Events
	x := newFollower(b, st)
	rng := rand.New(rand.NewPCG(1, 1))
	pages := pageTable(rng, g, cfg.NumPages, 1)
	fill(kv, g, []uint64{1}, pages)
	var saveNs, visibleNs time.Duration
	i := uint64(0)
	for b.Loop() {
		i++
		ch := []uint64{i << 20}
		t0 := time.Now()
		sv, err := s.SaveWithMeta(ch, pages, metaOf(g, ch))
		if err != nil {
			b.Fatal(err)
		}
		sv.Wait()
		t1 := time.Now()
		if err := x.WaitHolds("n", kvevents.IntHash(ch[0]), evWait); err != nil {
			b.Fatal(err)
		}
		saveNs += t1.Sub(t0)
		visibleNs += time.Since(t1)
	}
	b.ReportMetric(float64(saveNs.Nanoseconds())/float64(b.N), "save-ns")
	b.ReportMetric(float64(visibleNs.Nanoseconds())/float64(b.N), "commit-to-subscriber-ns")
}
