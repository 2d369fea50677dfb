package crashtest

import (
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
)

// Env names a crash test's two tests and the two environment variables
// through which the parent hands the child its store directories and its
// generation.
type Env struct {
	Parent, Child   string // test names, e.g. "TestCrash" and "TestCrashChild"
	DirsVar, GenVar string // e.g. "TUTTI_CRASH_DIRS" and "TUTTI_CRASH_GEN"
}

// ChildArgs returns, in the child, the store directories as the parent
// encoded them and the child's generation. Anywhere else it skips t: the
// child test runs only when the parent starts it.
func (e Env) ChildArgs(t testing.TB) (dirs string, gen uint64) {
	t.Helper()
	dirs = os.Getenv(e.DirsVar)
	if dirs == "" {
		t.Skip("run by " + e.Parent + " only")
	}
	gen, _ = strconv.ParseUint(os.Getenv(e.GenVar), 10, 64)
	return dirs, gen
}

// Fatalf reports the child's fatal error and ends the child with exit
// status 2 (the parent fails on the line).
func (r *Reporter) Fatalf(format string, args ...any) {
	r.Say(format, args...)
	os.Exit(2)
}

// SaveLoop is the child's body once its store is open and its KV memory
// registered: it reports ready, then saves chains until the parent's
// SIGKILL. The chains come from a generator seeded with (gen, stream): once
// a save succeeded, half of them extend an acknowledged chain by 1 to 3
// blocks (so saves meet committed prefixes), the others are fresh chains of
// 2 to 5 blocks; the i-th chain's new block k has id gen<<40 | i<<16 + k.
//
// For each chain, fill picks its pages with rng (the generator's, so the
// whole sequence follows from the seed) and writes the chain's content into
// them; then the chain is reported tried, and save saves it, waits, and says
// whether every block is now stored (reported ok). An error from save is the
// child's fatal error ("error save: ...").
func (r *Reporter) SaveLoop(gen, stream uint64, fill func(rng *rand.Rand, chain []uint64) (pages []int32),
	save func(chain []uint64, pages []int32) (complete bool, err error)) {
	r.Ready()
	rng := rand.New(rand.NewPCG(gen, stream))
	var acked [][]uint64
	for i := uint64(0); ; i++ {
		var chain []uint64
		if len(acked) > 0 && rng.IntN(2) == 0 {
			base := acked[rng.IntN(len(acked))]
			chain = append(append([]uint64(nil), base...), Chain(gen<<40|i<<16, 1+rng.IntN(3))...)
		} else {
			chain = Chain(gen<<40|i<<16, 2+rng.IntN(4))
		}
		pages := fill(rng, chain)
		r.Try(chain)
		complete, err := save(chain, pages)
		if err != nil {
			r.Fatalf("error save: %v", err)
		}
		if complete {
			r.OK(chain)
			acked = append(acked, chain)
		}
	}
}

// Chain returns n consecutive block ids from base (the crash tests' and the
// runtime tests' chains).
func Chain(base uint64, n int) []uint64 {
	c := make([]uint64, n)
	for k := range c {
		c[k] = base + uint64(k)
	}
	return c
}
