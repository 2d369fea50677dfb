// Package benchenv is what the store's restore benchmarks share (runtime's
// BenchmarkRestore70B and BenchmarkRestoreStriped70B, runtime/tp's
// BenchmarkGroupRestore): their TUTTI_BENCH_* environment knobs, the
// Llama-3-70B KV shape, the sizing of a store that holds one restore, and
// the timed loop. Tests and benchmarks only; it must not be imported by
// package code.
//
// Knobs read here: TUTTI_BENCH_PATH=gpu (GPU), TUTTI_BENCH_LAYERS (Layers),
// TUTTI_BENCH_STAGING_MIB and TUTTI_BENCH_SLOT_MIB (Size), and DirsKnob,
// TUTTI_BENCH_DIRS (Dirs, Roots), the only one that says where. Each
// benchmark documents the knobs it reads.
package benchenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tutti-io/tutti/kvshape"
)

// Int returns the positive integer in the environment variable name, or def
// when it is unset, not a number or not positive.
func Int(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// GPU says whether TUTTI_BENCH_PATH=gpu asks for the GPU path.
func GPU() bool { return os.Getenv("TUTTI_BENCH_PATH") == "gpu" }

// Layers is TUTTI_BENCH_LAYERS (default 80, the whole 70B model).
func Layers() int { return Int("TUTTI_BENCH_LAYERS", 80) }

// Llama70B is the Llama-3-70B KV shape (8 KV heads, head dim 128, bf16,
// 16-token pages, K and V planes) with the given layers and pages per chain
// block (1: vLLM's per-page hashing; 32: 512-token blocks).
func Llama70B(layers, chunkPages int) kvshape.Geometry {
	return kvshape.Geometry{Layers: layers, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16,
		Planes: 2, PageTokens: 16, ChunkPages: chunkPages}
}

// Sizing is the configuration of a store that holds one restore of
// payloadBytes: the payload plus an eighth and 64 MiB of capacity,
// TUTTI_BENCH_STAGING_MIB (default 256) of staging in TUTTI_BENCH_SLOT_MIB
// (default 32) slots, queue depth 64, and a save bound and budget that let
// the one large save finish whole.
type Sizing struct {
	CapacityBytes, StagingBytes, StagingSlotBytes, SaveBudgetBytes int64
	QueueDepth, SaveBoundMs                                        int
}

// Size returns the Sizing for payloadBytes.
func Size(payloadBytes int64) Sizing {
	return Sizing{
		CapacityBytes:    payloadBytes + payloadBytes/8 + 64<<20,
		StagingBytes:     int64(Int("TUTTI_BENCH_STAGING_MIB", 256)) << 20,
		StagingSlotBytes: int64(Int("TUTTI_BENCH_SLOT_MIB", 32)) << 20,
		QueueDepth:       64,
		SaveBoundMs:      600000,
		SaveBudgetBytes:  payloadBytes * 2,
	}
}

// Under makes a fresh directory under root (os.MkdirTemp's pattern) and
// removes it with all it holds when the benchmark's run ends.
func Under(tb testing.TB, root, pattern string) string {
	tb.Helper()
	d, err := os.MkdirTemp(root, pattern)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// DirsKnob is the one knob that says where the restore benchmarks run:
// comma-separated directories, one file system each. A benchmark without it
// is skipped, never run on a temporary directory whose device nobody chose
// (its ceiling would be measured elsewhere than the restore).
const DirsKnob = "TUTTI_BENCH_DIRS"

// retiredDirKnob was the single-directory knob; a benchmark that finds it
// set fails, so that a script that still sets it does not silently measure
// something else.
const retiredDirKnob = "TUTTI_BENCH_DIR"

// Roots is DirsKnob's directories. It skips tb when the knob is unset and
// fails it when the retired TUTTI_BENCH_DIR is set or a listed directory
// does not exist.
func Roots(tb testing.TB) []string {
	tb.Helper()
	roots, skip, err := rootsFrom(os.Getenv(DirsKnob), os.Getenv(retiredDirKnob))
	if err != nil {
		tb.Fatal(err)
	}
	if skip != "" {
		tb.Skip(skip)
	}
	return roots
}

// rootsFrom is Roots on the knobs' values: the directories, or why the
// benchmark is skipped, or why it fails.
func rootsFrom(dirs, retired string) (roots []string, skip string, err error) {
	if retired != "" {
		return nil, "", fmt.Errorf("%s is retired: list the store directories in %s", retiredDirKnob, DirsKnob)
	}
	if dirs == "" {
		return nil, fmt.Sprintf("restore benchmark skipped: set %s to the store directories to measure (one file system each)", DirsKnob), nil
	}
	roots = strings.Split(dirs, ",")
	for _, r := range roots {
		if st, err := os.Stat(r); err != nil || !st.IsDir() {
			return nil, "", fmt.Errorf("%s: %q is not a directory (%v)", DirsKnob, r, err)
		}
	}
	return roots, "", nil
}

// Dirs is a fresh store directory under each of Roots, removed when tb ends.
func Dirs(tb testing.TB) []string {
	tb.Helper()
	var dirs []string
	for _, root := range Roots(tb) {
		dirs = append(dirs, Under(tb, root, "tutti-bench-"))
	}
	return dirs
}

// Loaded is a load in flight (runtime's and runtime/tp's Load).
type Loaded interface {
	Wait() error
	Blocks() int
}

// TimeLoads runs load (start restoring the whole prefix of blocks chain
// blocks, payload bytes: b's SetBytes) b.N times, each waited for, with b's
// timer reset before and stopped after, and returns the loads' bytes per
// second (payload over each load's own time, start to Wait). An error, or a
// load that restored fewer blocks, fails b; why(l), when not nil, adds to
// the message.
func TimeLoads[L Loaded](b *testing.B, blocks int, payload int64, load func() (L, error), why func(L) string) float64 {
	b.Helper()
	b.SetBytes(payload)
	var elapsed time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		l, err := load()
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Wait(); err != nil {
			b.Fatal(err)
		}
		elapsed += time.Since(start)
		if l.Blocks() != blocks {
			msg := ""
			if why != nil {
				msg = why(l)
			}
			b.Fatalf("restored %d of %d blocks%s", l.Blocks(), blocks, msg)
		}
	}
	b.StopTimer()
	return float64(payload) * float64(b.N) / elapsed.Seconds()
}
