package benchenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestInt(t *testing.T) {
	// Unset, not a number and not positive all read as the default.
	want := map[string]int{"": 7, "12": 12, "0": 7, "-3": 7, "x": 7}
	for env, n := range want {
		t.Setenv("TUTTI_BENCH_TEST_INT", env)
		if got := Int("TUTTI_BENCH_TEST_INT", 7); got != n {
			t.Errorf("TUTTI_BENCH_TEST_INT=%q: got %d, want %d", env, got, n)
		}
	}
}

func TestSize(t *testing.T) {
	t.Setenv("TUTTI_BENCH_STAGING_MIB", "")
	t.Setenv("TUTTI_BENCH_SLOT_MIB", "8")
	z := Size(800 << 20)
	want := Sizing{CapacityBytes: 900<<20 + 64<<20, StagingBytes: 256 << 20, StagingSlotBytes: 8 << 20,
		SaveBudgetBytes: 1600 << 20, QueueDepth: 64, SaveBoundMs: 600000}
	if z != want {
		t.Fatalf("got %+v, want %+v", z, want)
	}
}

func TestLlama70B(t *testing.T) {
	t.Setenv("TUTTI_BENCH_LAYERS", "")
	g := Llama70B(Layers(), 1)
	if err := g.Validate(); err != nil {
		t.Fatal(err)
	}
	// 32K tokens of the whole model are 10 GiB.
	if got := int64(32<<10/g.PageTokens) * g.ChunkBytes(); got != 10<<30 {
		t.Fatalf("32K tokens: %d bytes, want 10 GiB", got)
	}
}

func TestRootsFrom(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	for _, c := range []struct {
		name, dirs, retired string
		roots               []string
		skip, fail          bool
	}{
		{name: "unset: skipped, never a temporary directory", skip: true},
		{name: "two roots", dirs: a + "," + b, roots: []string{a, b}},
		{name: "the retired knob fails", dirs: a, retired: a, fail: true},
		{name: "retired alone fails too", retired: a, fail: true},
		{name: "a missing root fails", dirs: a + "," + filepath.Join(b, "nope"), fail: true},
	} {
		roots, skip, err := rootsFrom(c.dirs, c.retired)
		if (err != nil) != c.fail || (skip != "") != c.skip || strings.Join(roots, ",") != strings.Join(c.roots, ",") {
			t.Errorf("%s: roots %q, skip %q, err %v", c.name, roots, skip, err)
		}
	}
}

func TestDirs(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	t.Setenv("TUTTI_BENCH_DIR", "")
	t.Setenv("TUTTI_BENCH_DIRS", a+","+b)
	var made []string
	t.Run("run", func(t *testing.T) {
		made = Dirs(t)
		if len(made) != 2 || filepath.Dir(made[0]) != a || filepath.Dir(made[1]) != b {
			t.Fatalf("dirs %q: want one fresh directory under each of %q, %q", made, a, b)
		}
	})
	for _, d := range made {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s still there after the run: %v", d, err)
		}
	}
}
