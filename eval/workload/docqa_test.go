package workload

import (
	"errors"
	"math"
	"reflect"
	"testing"
)

func TestDocQAShape(t *testing.T) {
	w := DefaultDocQA
	w.Documents, w.QuestionsPerDoc = 12, 5
	reqs, err := w.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 60 {
		t.Fatalf("%d requests, want 60", len(reqs))
	}
	again, _ := w.Generate()
	if !reflect.DeepEqual(reqs, again) {
		t.Fatal("two generations with one seed differ")
	}
	w2 := w
	w2.Seed++
	other, _ := w2.Generate()
	if reflect.DeepEqual(reqs[0].HashIDs, other[0].HashIDs) {
		t.Fatal("another seed gave the same first request")
	}
	// Group by the first id (a document's first block): questions of one
	// document share exactly its full blocks; no id is shared across
	// documents.
	byDoc := map[uint64][]int{}
	owner := map[uint64]uint64{}
	prev := -1.0
	for i, r := range reqs {
		if r.ArrivalMs < prev || r.TimestampMs != r.ArrivalMs || r.Line != i+1 {
			t.Fatalf("request %d: arrival %v after %v, line %d", i, r.ArrivalMs, prev, r.Line)
		}
		prev = r.ArrivalMs
		if len(r.HashIDs) != (r.InputTokens+w.BlockTokens-1)/w.BlockTokens {
			t.Fatalf("request %d: %d ids for %d tokens", i, len(r.HashIDs), r.InputTokens)
		}
		if r.InputTokens < w.MinDocTokens+w.MinQuestionTokens || r.InputTokens > w.MaxDocTokens+w.MaxQuestionTokens {
			t.Fatalf("request %d: %d tokens out of range", i, r.InputTokens)
		}
		byDoc[r.HashIDs[0]] = append(byDoc[r.HashIDs[0]], i)
		for _, id := range r.HashIDs {
			if o, ok := owner[id]; ok && o != r.HashIDs[0] {
				t.Fatalf("id %x in two documents", id)
			}
			owner[id] = r.HashIDs[0]
		}
	}
	if len(byDoc) != 12 {
		t.Fatalf("%d documents, want 12", len(byDoc))
	}
	for _, qs := range byDoc {
		if len(qs) != 5 {
			t.Fatalf("a document has %d questions, want 5", len(qs))
		}
		a, b := reqs[qs[0]], reqs[qs[1]]
		common := 0
		for common < min(len(a.HashIDs), len(b.HashIDs)) && a.HashIDs[common] == b.HashIDs[common] {
			common++
		}
		// The document's full blocks: at least (shortest prompt - longest question) / B.
		want := (min(a.InputTokens, b.InputTokens) - w.MaxQuestionTokens) / w.BlockTokens
		if common < want || common >= min(len(a.HashIDs), len(b.HashIDs)) {
			t.Fatalf("two questions of one document share %d leading blocks, want the document's (≥ %d) and not their suffix", common, want)
		}
	}
}

func TestDocQAPoissonRate(t *testing.T) {
	w := DefaultDocQA
	w.Documents, w.QuestionsPerDoc, w.MinDocTokens, w.MaxDocTokens, w.RatePerS = 500, 4, 1024, 2048, 8
	reqs, err := w.Generate()
	if err != nil {
		t.Fatal(err)
	}
	rate := float64(len(reqs)-1) / (reqs[len(reqs)-1].ArrivalMs / 1000)
	if math.Abs(rate-8)/8 > 0.1 {
		t.Fatalf("rate %.2f req/s over %d requests, want 8 ± 10%%", rate, len(reqs))
	}
}

func TestDocQAValidate(t *testing.T) {
	for name, mut := range map[string]func(*DocQA){
		"no documents":   func(w *DocQA) { w.Documents = 0 },
		"too many":       func(w *DocQA) { w.Documents, w.QuestionsPerDoc = MaxRequests, 2 },
		"min above max":  func(w *DocQA) { w.MinDocTokens = w.MaxDocTokens + 1 },
		"huge document":  func(w *DocQA) { w.MaxDocTokens = MaxDocTokens + 1 },
		"empty question": func(w *DocQA) { w.MinQuestionTokens = 0 },
		"zero rate":      func(w *DocQA) { w.RatePerS = 0 },
		"infinite rate":  func(w *DocQA) { w.RatePerS = math.Inf(1) },
		"no block":       func(w *DocQA) { w.BlockTokens = 0 },
	} {
		w := DefaultDocQA
		mut(&w)
		if _, err := w.Generate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}
