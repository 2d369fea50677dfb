package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestRemoveTree: every file and directory under the tree goes (the kept
// file stays, and so does the root with it); a removal that lasts reports
// its progress, ending with every file removed; a missing tree is no error.
func TestRemoveTree(t *testing.T) {
	defer func(q time.Duration) { removeQuietFor = q }(removeQuietFor)
	removeQuietFor = 0
	mkTree := func() string {
		dir := filepath.Join(t.TempDir(), "store")
		for i := range 300 {
			p := filepath.Join(dir, fmt.Sprintf("sub%d", i%3), fmt.Sprintf("%x.kv", i))
			if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("kv"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, lockFileName), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}

	dir := mkTree()
	var mu sync.Mutex
	var calls [][2]int
	if err := removeTree(dir, lockFileName, func(done, total int) {
		mu.Lock()
		calls = append(calls, [2]int{done, total})
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 1 || left[0].Name() != lockFileName {
		t.Fatalf("left %v, want only %s", left, lockFileName)
	}
	if len(calls) == 0 || calls[len(calls)-1] != [2]int{300, 300} {
		t.Fatalf("progress %v, want it to end at 300 of 300 files", calls)
	}

	dir = mkTree()
	if err := removeTree(dir, "", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("%s still there: %v", dir, err)
	}
	if err := removeTree(dir, "", nil); err != nil {
		t.Fatalf("a missing tree: %v", err)
	}
}
