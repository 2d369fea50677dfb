package gpubench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/objmap"
)

func TestSplitStorePaths(t *testing.T) {
	for _, c := range []struct {
		in             string
		kernels, store []string
	}{
		{"gpu,store-cpu, uring,store-gpu", []string{"gpu", "uring"}, []string{"store-cpu", "store-gpu"}},
		{"store-cpu", nil, []string{"store-cpu"}},
		{"gpu-kick,,per-block", []string{"gpu-kick", "per-block"}, nil},
	} {
		k, s := splitStorePaths(c.in)
		if !slices.Equal(k, c.kernels) || !slices.Equal(s, c.store) {
			t.Errorf("%q: %v %v, want %v %v", c.in, k, s, c.kernels, c.store)
		}
	}
}

// TestRunDirLocked: a gpubench whose --dir another holds (a second gpubench,
// a store) fails naming the holder's pid, and leaves the data file and its
// .layout sidecar as they were.
func TestRunDirLocked(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "gpubench-tiny.dat")
	for _, f := range []string{data, data + ".layout"} {
		if err := os.WriteFile(f, []byte("kept"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	held, err := objmap.LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Model: "tiny", Tokens: 256, Dir: dir, Stripe: StripeRuns, Paths: "uring", QD: 8, Rounds: 1, GPUs: 1}
	var out, errb bytes.Buffer
	err = Run(context.Background(), cfg, &out, &errb)
	if pid := fmt.Sprintf("pid %d", os.Getpid()); !errors.Is(err, objmap.ErrLocked) || !strings.Contains(err.Error(), pid) || !strings.Contains(err.Error(), "--dir") {
		t.Fatalf("held --dir: %v, want ErrLocked naming --dir and %s", err, pid)
	}
	for _, f := range []string{data, data + ".layout"} {
		if b, err := os.ReadFile(f); err != nil || string(b) != "kept" {
			t.Fatalf("%s after the refused run: %q, %v", f, b, err)
		}
	}
	held.Unlock()
	if err := Run(context.Background(), cfg, &out, &errb); errors.Is(err, objmap.ErrLocked) {
		t.Fatalf("released --dir: %v", err)
	}
}

// TestRunStoreProgress: the store paths report each finished path, and a
// cancelled context starts none.
func TestRunStoreProgress(t *testing.T) {
	var got []string
	cfg := Config{Model: "tiny", Tokens: 2048, Dir: t.TempDir(), Paths: PathStoreCPU, Rounds: 1, GPUs: 1, Stripe: StripeRuns, NoCeiling: true,
		Progress: func(phase string, done, total int) { got = append(got, fmt.Sprintf("%s %d/%d", phase, done, total)) }}
	var out, errb bytes.Buffer
	if err := Run(context.Background(), cfg, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	if want := []string{"gpubench store paths 1/1"}; !slices.Equal(got, want) {
		t.Fatalf("progress %q, want %q", got, want)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	got = nil
	if err := Run(ctx, cfg, &out, &errb); !errors.Is(err, context.Canceled) || got != nil {
		t.Fatalf("cancelled: %v, progress %q", err, got)
	}
}
