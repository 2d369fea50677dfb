package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/objmap"
)

// TestLockFileName: lockFileName is the file objmap.LockDir flocks.
func TestLockFileName(t *testing.T) {
	d := t.TempDir()
	l, err := objmap.LockDir(d)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	if _, err := os.Stat(filepath.Join(d, lockFileName)); err != nil {
		t.Fatalf("objmap.LockDir made no %s: %v", lockFileName, err)
	}
}

// TestRunTakesStoreLocks: a replay on a root another holder has locked (a
// replay running there) and on a root whose backend directory holds a store
// that is open both fail with objmap.ErrLocked naming the holder's pid, and
// remove nothing; once released, the same run succeeds and removes its
// backend directories.
func TestRunTakesStoreLocks(t *testing.T) {
	p, _ := model.Lookup("tiny")
	comp, _ := NewCompute(p, DefaultGPUFLOPs, DefaultLayerFixedNs)
	cfg := func(root string) Config {
		return Config{Requests: synthetic(6), Profile: p, Dir: root, Compute: comp, CeilingBytes: -1,
			Backends: []Backend{NewPerBlock(), NewTuttiCPU(&comp)}}
	}
	pid := fmt.Sprintf("pid %d", os.Getpid())

	// The root is held: nothing under it is touched.
	root := t.TempDir()
	keep := filepath.Join(root, "per-block", "slots.dat")
	if err := os.MkdirAll(filepath.Dir(keep), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keep, []byte("another replay's"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := objmap.LockDir(root)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), cfg(root))
	if !errors.Is(err, objmap.ErrLocked) || !strings.Contains(err.Error(), pid) || !strings.Contains(err.Error(), root) {
		t.Fatalf("held root: %v, want ErrLocked naming %s and %s", err, root, pid)
	}
	if b, err := os.ReadFile(keep); err != nil || string(b) != "another replay's" {
		t.Fatalf("held root: %s is %q, %v: the replay touched it", keep, b, err)
	}
	l.Unlock()

	// A tutti store open in root/tutti-cpu (a runtime has it open).
	g, _ := p.Geometry()
	storeDir := filepath.Join(root, "tutti-cpu")
	rt, err := objmap.Open(objmap.Options{Dirs: []string{storeDir}, Geometry: g, CapacityBytes: 8 * g.ChunkBytes(), Buffered: true})
	if err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadDir(storeDir)
	_, err = Run(context.Background(), cfg(root))
	if !errors.Is(err, objmap.ErrLocked) || !strings.Contains(err.Error(), pid) || !strings.Contains(err.Error(), storeDir) {
		t.Fatalf("open store: %v, want ErrLocked naming %s and %s", err, storeDir, pid)
	}
	after, _ := os.ReadDir(storeDir)
	if len(after) != len(before) || len(before) < 2 {
		t.Fatalf("open store: %d entries before, %d after: the replay changed it", len(before), len(after))
	}
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}

	// Released: the run reuses and then removes both directories.
	res, err := Run(context.Background(), cfg(root))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range res.Backends {
		if b.Skipped != "" || b.VerifyMismatches != 0 {
			t.Fatalf("%+v", b)
		}
		if _, err := os.Stat(filepath.Join(root, b.Backend)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s's directory left after the run: %v", b.Backend, err)
		}
	}
}
