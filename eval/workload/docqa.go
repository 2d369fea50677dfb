// Package workload generates request streams for `tutti replay` in the
// request type of a Mooncake-format trace (internal/trace.Request: token
// counts and chained block ids), so a generated workload runs through the
// same harness, index and reports as a trace.
package workload

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/tutti-io/tutti/internal/trace"
)

// DocQA describes a long-document question-answering workload in the shape
// of LEval and LooGLE: long documents, several questions about each, every
// question a short suffix after its whole document. A request's prompt is
// the document followed by the question, so its leading full blocks are
// the document's blocks (the same chained ids for every question of that
// document) and the rest (the document's partial last block, then the
// question) are its own.
type DocQA struct {
	Documents int // documents (≥ 1)
	// MinDocTokens..MaxDocTokens: each document's length, log-uniform (LEval
	// and LooGLE documents range from a few thousand to 100K+ tokens).
	MinDocTokens, MaxDocTokens int
	QuestionsPerDoc            int // questions per document (≥ 1)
	// MinQuestionTokens..MaxQuestionTokens: each question's length,
	// uniform: short suffixes.
	MinQuestionTokens, MaxQuestionTokens int
	OutputTokens                         int     // generated tokens per request (in the trace only)
	RatePerS                             float64 // Poisson arrival rate (requests per second, > 0)
	Seed                                 uint64
	BlockTokens                          int // tokens per chain block (> 0)
}

// DefaultDocQA is the docqa workload with no flags, what `tutti replay`
// runs first: documents long enough that restoring their KV beats
// recomputing it, and enough questions after each that most block
// references hit, few enough that every backend's saves and restores fit
// about a minute on two CPU cores.
var DefaultDocQA = DocQA{Documents: 8, MinDocTokens: 8 << 10, MaxDocTokens: 128 << 10, QuestionsPerDoc: 8,
	MinQuestionTokens: 32, MaxQuestionTokens: 256, OutputTokens: 64, RatePerS: 1, Seed: 1, BlockTokens: trace.DefaultBlockTokens}

// Limits on what Generate makes.
const (
	MaxRequests  = 1 << 20
	MaxDocTokens = 1 << 21
)

// ErrInvalid is wrapped by every parameter error.
var ErrInvalid = errors.New("invalid docqa workload")

// Validate reports a parameter out of range, by name.
func (w DocQA) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
	}
	switch {
	case w.Documents < 1 || w.QuestionsPerDoc < 1 || int64(w.Documents)*int64(w.QuestionsPerDoc) > MaxRequests:
		return bad("%d documents × %d questions: want ≥ 1 each and at most %d requests", w.Documents, w.QuestionsPerDoc, MaxRequests)
	case w.MinDocTokens < 1 || w.MaxDocTokens < w.MinDocTokens || w.MaxDocTokens > MaxDocTokens:
		return bad("document tokens %d..%d: want 1 ≤ min ≤ max ≤ %d", w.MinDocTokens, w.MaxDocTokens, MaxDocTokens)
	case w.MinQuestionTokens < 1 || w.MaxQuestionTokens < w.MinQuestionTokens || w.MaxQuestionTokens > MaxDocTokens:
		return bad("question tokens %d..%d: want 1 ≤ min ≤ max ≤ %d", w.MinQuestionTokens, w.MaxQuestionTokens, MaxDocTokens)
	case !(w.RatePerS > 0) || math.IsInf(w.RatePerS, 0):
		return bad("rate %v: want a finite rate > 0", w.RatePerS)
	case w.BlockTokens < 1:
		return bad("block tokens %d: want > 0", w.BlockTokens)
	case w.OutputTokens < 0:
		return bad("output tokens %d: want ≥ 0", w.OutputTokens)
	}
	return nil
}

// mix is splitmix64's finaliser: block ids from (document, question, block)
// so equal prefixes get equal ids and different ones collide with
// probability ~2^-64.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// QA is one docqa request in the workload's own terms: which document and
// which of its questions, both lengths, and the arrival time. It is what an
// engine that takes token ids needs to rebuild the same prompts (the
// document's tokens, then the question's), so the replay and a real engine
// serve the same requests in the same order (eval/vllm/headline.py).
type QA struct {
	Doc            int     `json:"doc"`      // 0-based document
	Question       int     `json:"question"` // 0-based question of that document
	DocTokens      int     `json:"doc_tokens"`
	QuestionTokens int     `json:"question_tokens"`
	ArrivalMs      float64 `json:"arrival_ms"` // from the first request's arrival (0)
}

// Plan returns the Documents × QuestionsPerDoc requests in arrival order:
// the questions of all documents in a seeded random order (a document's
// first question brings its whole prefix, the later ones find it cached
// unless it was evicted in between), arriving as a Poisson process at
// RatePerS. Deterministic in the parameters; RatePerS scales the arrival
// times and changes nothing else (every draw is taken at any rate).
func (w DocQA) Plan() ([]QA, error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(w.Seed, 0x646f637161)) // "docqa"
	docTokens := make([]int, w.Documents)
	lo, hi := math.Log(float64(w.MinDocTokens)), math.Log(float64(w.MaxDocTokens))
	for d := range docTokens {
		docTokens[d] = min(w.MaxDocTokens, max(w.MinDocTokens, int(math.Round(math.Exp(lo+(hi-lo)*rng.Float64())))))
	}
	qs := make([]QA, 0, w.Documents*w.QuestionsPerDoc)
	for d := 0; d < w.Documents; d++ {
		for n := 0; n < w.QuestionsPerDoc; n++ {
			qs = append(qs, QA{Doc: d, Question: n, DocTokens: docTokens[d]})
		}
	}
	rng.Shuffle(len(qs), func(i, j int) { qs[i], qs[j] = qs[j], qs[i] })
	t := 0.0
	for i := range qs {
		if i > 0 {
			t += rng.ExpFloat64() / w.RatePerS * 1000
		}
		qs[i].QuestionTokens = w.MinQuestionTokens + rng.IntN(w.MaxQuestionTokens-w.MinQuestionTokens+1)
		qs[i].ArrivalMs = t
	}
	return qs, nil
}

// Generate returns Plan's requests as a trace: Line is the 1-based
// position, TimestampMs and ArrivalMs the arrival time, and the chain ids
// are the document's full blocks (the same for every question of that
// document) followed by the request's own (the document's partial last
// block, then the question).
func (w DocQA) Generate() ([]trace.Request, error) {
	qs, err := w.Plan()
	if err != nil {
		return nil, err
	}
	seed := mix(w.Seed ^ 0x9e3779b97f4a7c15)
	reqs := make([]trace.Request, len(qs))
	B := w.BlockTokens
	for i, x := range qs {
		input := x.DocTokens + x.QuestionTokens
		ids := make([]uint64, (input+B-1)/B)
		shared := x.DocTokens / B // the document's full blocks
		for b := range ids {
			own := uint64(0) // the document's blocks: the same for every question
			if b >= shared {
				own = 1 + uint64(x.Question)
			}
			ids[b] = mix(seed ^ mix(uint64(b)^mix(own^mix(uint64(x.Doc)))))
		}
		reqs[i] = trace.Request{Line: i + 1, TimestampMs: x.ArrivalMs, ArrivalMs: x.ArrivalMs, InputTokens: input, OutputTokens: w.OutputTokens, HashIDs: ids}
	}
	return reqs, nil
}

// Brief is the workload's shape in a few words, for a summary.
func (w DocQA) Brief() string {
	return fmt.Sprintf("%d documents of %s-%s tokens, %d questions after each", w.Documents, tokensK(w.MinDocTokens), tokensK(w.MaxDocTokens), w.QuestionsPerDoc)
}

// tokensK is n tokens as "8K" where n is a multiple of 1024.
func tokensK(n int) string {
	if n >= 1024 && n%1024 == 0 {
		return fmt.Sprintf("%dK", n>>10)
	}
	return fmt.Sprint(n)
}

// Describe is the workload in words, for reports.
func (w DocQA) Describe() string {
	return fmt.Sprintf("docqa (long-document QA in the shape of LEval/LooGLE, generated): %d documents of %d-%d tokens (log-uniform), %d questions each of %d-%d tokens after the whole document, in seeded random order, Poisson arrivals at %g req/s, seed %d",
		w.Documents, w.MinDocTokens, w.MaxDocTokens, w.QuestionsPerDoc, w.MinQuestionTokens, w.MaxQuestionTokens, w.RatePerS, w.Seed)
}
