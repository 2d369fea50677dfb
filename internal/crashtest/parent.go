package crashtest

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"
)

// Plan is how a crash test's parent spreads its kills. All its randomness
// (the kill delays, and whatever the checks draw from Point.Rand) comes from
// one generator seeded with (Seed, Stream), so a failure replays from the
// seed it prints.
type Plan struct {
	Env
	Seed, Stream        uint64
	Points, ShortPoints int // kill points (ShortPoints with -short)
	// PerStore: a fresh store every PerStore points, so the checks after
	// each kill (fsck reads every payload) do not grow with the whole test.
	PerStore int
	// MaxDelayMs: each kill comes 2 ms plus [0, MaxDelayMs) ms after the
	// child's ready.
	MaxDelayMs int
}

// Point is one kill point, as the checks after the restart see it. Run
// reuses it from point to point; checks must not keep it.
type Point struct {
	Seed  uint64
	Index int
	Delay time.Duration // from the child's ready to the kill
	Rand  *rand.Rand    // the plan's generator
	// Tried and OK are the chains this point's child tried and those it
	// acknowledged; OKAll holds every chain acknowledged since the store
	// was fresh.
	Tried, OK, OKAll [][]uint64
}

// Run skips t inside the child. Otherwise, for each point p: at every
// PerStore-th point fresh makes a new store and returns its directories
// encoded for the child's DirsVar; child generation p+1 runs on it and is
// killed after the point's delay; check reopens the store and checks it
// (failing t). Run logs the totals when it ends, also on a failure.
func (pl Plan) Run(t *testing.T, fresh func() (dirs string), check func(pt *Point)) {
	t.Helper()
	if os.Getenv(pl.DirsVar) != "" {
		t.Skip("in the child")
	}
	points := pl.Points
	if testing.Short() {
		points = pl.ShortPoints
	}
	pt := &Point{Seed: pl.Seed, Rand: rand.New(rand.NewPCG(pl.Seed, pl.Stream))}
	triedN, okN := 0, 0
	defer func() {
		t.Logf("seed %d: %d kill points, %d saves tried, %d returned success", pl.Seed, points, triedN, okN)
	}()
	var dirs string
	for p := 0; p < points; p++ {
		if p%pl.PerStore == 0 {
			dirs = fresh()
			pt.OKAll = nil
		}
		pt.Index = p
		pt.Delay = time.Duration(2+pt.Rand.IntN(pl.MaxDelayMs)) * time.Millisecond
		gen := uint64(p + 1)
		pt.Tried, pt.OK = RunChild(t, fmt.Sprintf("child generation %d", gen), pl.Child,
			[]string{pl.DirsVar + "=" + dirs, pl.GenVar + "=" + strconv.FormatUint(gen, 10)}, pt.Delay)
		pt.OKAll = append(pt.OKAll, pt.OK...)
		triedN += len(pt.Tried)
		okN += len(pt.OK)
		check(pt)
	}
}

// Fatalf fails t with the point's seed, index and kill delay before the
// message.
func (pt *Point) Fatalf(t testing.TB, format string, args ...any) {
	t.Helper()
	t.Fatalf("seed %d point %d (kill after %v): %s", pt.Seed, pt.Index, pt.Delay, fmt.Sprintf(format, args...))
}

// Restore loads chain from the reopened store into pages it picks with rng
// and waits. It returns how many leading blocks the load restored and a
// check of the first n of them against the chain's content; an error is the
// load's (it fails the test).
type Restore func(rng *rand.Rand, chain []uint64) (blocks int, verify func(n int) error, err error)

// CheckSaved fails t unless each of chains (acknowledged saves) restores in
// full and bit-exact: a save that returned success survives the kill.
// recovery (what the reopen reported) goes into the message.
func (pt *Point) CheckSaved(t testing.TB, chains [][]uint64, restore Restore, recovery any) {
	t.Helper()
	for _, ch := range chains {
		n, verify := pt.restore(t, ch, restore)
		if n != len(ch) {
			pt.Fatalf(t, "a save that returned success restores %d of %d blocks; recovery %+v", n, len(ch), recovery)
		}
		if err := verify(len(ch)); err != nil {
			t.Fatalf("seed %d point %d: %v", pt.Seed, pt.Index, err)
		}
	}
}

// CheckTried fails t unless whatever a load of each chain the point's child
// tried serves is bit-exact: nothing half-written is served.
func (pt *Point) CheckTried(t testing.TB, restore Restore) {
	t.Helper()
	for _, ch := range pt.Tried {
		n, verify := pt.restore(t, ch, restore)
		if err := verify(n); err != nil {
			pt.Fatalf(t, "served half-written data: %v", err)
		}
	}
}

func (pt *Point) restore(t testing.TB, ch []uint64, restore Restore) (int, func(int) error) {
	t.Helper()
	n, verify, err := restore(pt.Rand, ch)
	if err != nil {
		t.Fatalf("seed %d point %d: Load: %v", pt.Seed, pt.Index, err)
	}
	return n, verify
}
