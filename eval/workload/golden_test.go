package workload

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/docqa-headline.json from the generator")

// headlineDocQA is the docqa workload of BENCHMARKS.md's run A (llama3-8b on
// the GPU machine, eval/device-run.sh's defaults): 12 documents of 4K-8K
// tokens, 17 questions after each, 256-token blocks. eval/vllm/headline.py
// serves the same requests in real vLLM from testdata/docqa-headline.json.
var headlineDocQA = func() DocQA {
	w := DefaultDocQA
	w.Documents, w.QuestionsPerDoc, w.MinDocTokens, w.MaxDocTokens, w.BlockTokens = 12, 17, 4096, 8192, 256
	return w
}()

// headlineFile is what testdata/docqa-headline.json holds: the parameters,
// Plan's requests, and each request's chain ids from Generate (so a
// consumer that rebuilds token ids can check its prompts share exactly the
// blocks the replay's requests share).
type headlineFile struct {
	Workload string        `json:"workload"`
	Params   DocQA         `json:"params"`
	Requests []headlineReq `json:"requests"`
}

type headlineReq struct {
	QA
	HashIDs []string `json:"hash_ids"` // hex: JSON readers that parse numbers as float64 would round them
}

func headlineJSON(t *testing.T) []byte {
	w := headlineDocQA
	qs, err := w.Plan()
	if err != nil {
		t.Fatal(err)
	}
	reqs, err := w.Generate()
	if err != nil {
		t.Fatal(err)
	}
	f := headlineFile{Workload: w.Describe(), Params: w}
	for i, q := range qs {
		r := headlineReq{QA: q}
		for _, id := range reqs[i].HashIDs {
			r.HashIDs = append(r.HashIDs, fmt.Sprintf("%016x", id))
		}
		f.Requests = append(f.Requests, r)
	}
	var b bytes.Buffer
	b.WriteString("{\"workload\": ")
	must(t, json.NewEncoder(&b).Encode(f.Workload))
	b.WriteString(", \"params\": ")
	must(t, json.NewEncoder(&b).Encode(f.Params))
	b.WriteString(", \"requests\": [\n")
	for i, r := range f.Requests {
		line, err := json.Marshal(r)
		must(t, err)
		b.Write(line)
		if i < len(f.Requests)-1 {
			b.WriteString(",")
		}
		b.WriteString("\n")
	}
	b.WriteString("]}\n")
	return b.Bytes()
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// The committed file is what the generator makes today: a change to the
// generator shows up here, and the vLLM headline then serves what the
// replay serves once the file is rewritten (go test ./eval/workload -run
// Headline -update).
func TestDocQAHeadlineGolden(t *testing.T) {
	path := filepath.Join("testdata", "docqa-headline.json")
	got := headlineJSON(t)
	if *update {
		must(t, os.MkdirAll("testdata", 0o755))
		must(t, os.WriteFile(path, got, 0o644))
	}
	want, err := os.ReadFile(path)
	must(t, err)
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from the generator's output: rewrite it with -update if the change is meant", path)
	}
	var f headlineFile
	must(t, json.Unmarshal(want, &f))
	if f.Params != headlineDocQA || len(f.Requests) != 12*17 {
		t.Fatalf("file holds %+v and %d requests", f.Params, len(f.Requests))
	}
}

// Plan at another rate is the same requests with arrival times scaled: a
// real engine can serve any rate from the rate-1 file.
func TestDocQAPlanRateScales(t *testing.T) {
	w := headlineDocQA
	base, err := w.Plan()
	must(t, err)
	for _, rate := range []float64{0.5, 3.7, 16} {
		w.RatePerS = rate
		got, err := w.Plan()
		must(t, err)
		for i := range got {
			g, b := got[i], base[i]
			want := b.ArrivalMs / rate
			if g.Doc != b.Doc || g.Question != b.Question || g.DocTokens != b.DocTokens || g.QuestionTokens != b.QuestionTokens ||
				math.Abs(g.ArrivalMs-want) > 1e-9*max(1, want) {
				t.Fatalf("rate %v request %d: %+v, want %+v with arrival %v", rate, i, g, b, want)
			}
		}
	}
}
