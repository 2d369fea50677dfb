package kvevents_test

import (
	"testing"
	"time"

	"github.com/tutti-io/tutti/kvevents"
	"github.com/tutti-io/tutti/kvevents/kvindex"
)

func benchEvent(i int) kvevents.Event {
	e := kvevents.Event{Kind: kvevents.BlockStored, BlockSize: 16, Medium: kvevents.MediumFS, Locality: kvevents.LocalityLocal, HasParent: true,
		Parent: kvevents.IntHash(uint64(i) << 1), Hashes: []kvevents.Hash{kvevents.IntHash(uint64(i)<<1 | 1)}}
	e.Tokens = make([]uint32, 16)
	for j := range e.Tokens {
		e.Tokens[j] = uint32(i*16 + j)
	}
	return e
}

// BenchmarkEncodeBatch is the ceiling of BenchmarkPublish: encoding one
// batch of 64 one-block BlockStored events, per event, in each format.
func BenchmarkEncodeBatch(b *testing.B) {
	evs := make([]kvevents.Event, 64)
	for i := range evs {
		evs[i] = benchEvent(i)
	}
	for _, f := range []kvevents.Format{kvevents.FormatVLLM026, kvevents.FormatVLLM011} {
		b.Run(f.String(), func(b *testing.B) {
			var buf []byte
			b.ReportAllocs()
			for b.Loop() {
				buf = kvevents.AppendBatch(buf[:0], &kvevents.Batch{TS: 1, Events: evs, Format: f})
			}
			b.ReportMetric(float64(b.N*64)/b.Elapsed().Seconds(), "events/s")
			b.SetBytes(int64(len(buf)))
		})
	}
}

// BenchmarkPublish: one-block BlockStored events from Do to a subscriber
// that applied them (TCP on 127.0.0.1), per event.
func BenchmarkPublish(b *testing.B) {
	p, err := kvevents.New(kvevents.Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", MaxQueueEvents: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	x := kvindex.New()
	defer x.Close()
	if err := x.Follow(kvindex.Node{ID: "a", Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint()}); err != nil {
		b.Fatal(err)
	}
	if err := x.WaitSeq("a", 0, 10*time.Second); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	i := 0
	for b.Loop() {
		e := benchEvent(i)
		i++
		p.Do(func(emit func(kvevents.Event)) { emit(e) })
	}
	p.Flush()
	if err := x.WaitSeq("a", p.Stats().LastSeq, 30*time.Second); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	st := p.Stats()
	ns, _ := x.Stats("a")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(st.Events)/float64(max(st.Batches, 1)), "events/batch")
	b.ReportMetric(float64(st.DroppedEvents+ns.Gaps), "drops+gaps")
}
