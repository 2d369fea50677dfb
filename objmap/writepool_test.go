package objmap

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// unwrittenExtents counts the unwritten ranges (FIEMAP_EXTENT_UNWRITTEN:
// preallocated, never written; adjacent extents merged) of the file at path,
// through the parser Prewrite uses (fiemapUnwritten); ok false where the
// file system cannot say. The cases' ground truth (fallocate leaves
// extents unwritten, written ones are not) checks that parser too.
func unwrittenExtents(t *testing.T, path string) (n int, ok bool) {
	t.Helper()
	u, ok := unwrittenOf(t, path)
	return len(u), ok
}

// unwrittenOf is the unwritten ranges of the file at path (FIEMAP, through
// fiemapUnwritten); ok false where the file system cannot say.
func unwrittenOf(t *testing.T, path string) (u []extent, ok bool) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	u, err = fiemapUnwritten(int(f.Fd()), st.Size())
	if errors.Is(err, ErrPrewriteUnsupported) {
		return nil, false
	}
	if err != nil {
		t.Fatalf("FIEMAP %s: %v", path, err)
	}
	return u, true
}

// unwrittenBytes is the bytes of path's unwritten extents (FIEMAP); ok is
// false where the file system does not report them.
func unwrittenBytes(t *testing.T, path string) (n int64, ok bool) {
	t.Helper()
	u, ok := unwrittenOf(t, path)
	for _, e := range u {
		n += e.n
	}
	return n, ok
}

// WritePool leaves no unwritten extent in the pool files (a fresh store's
// first saves overwrite written blocks); without it, fallocate leaves them
// unwritten, which is what the option is for. Buffered (tmpfs's way) writes
// too. Skipped where the file system does not report extents.
func TestWritePool(t *testing.T) {
	for _, tc := range []struct {
		name            string
		write, buffered bool
		wantUnwritten   bool
	}{{"fallocate only", false, false, true}, {"written", true, false, false}, {"written buffered", true, true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			o := testOpts(t, filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b"))
			o.CapacityBytes, o.WritePool, o.Buffered = 24<<20, tc.write, tc.buffered
			m := mustOpen(t, o)
			defer m.Close()
			for _, d := range o.Dirs {
				p := filepath.Join(d, poolFileName(0))
				if _, err := os.Stat(p); err != nil {
					p = filepath.Join(d, poolFileName(1))
				}
				st, err := os.Stat(p)
				if err != nil || st.Size() != 12<<20 {
					t.Fatalf("pool file in %s: %v, size %v", d, err, st)
				}
				n, ok := unwrittenExtents(t, p)
				if !ok {
					t.Skipf("the file system under %s does not report extents (FIEMAP)", d)
				}
				if (n > 0) != tc.wantUnwritten {
					t.Fatalf("%s: %d unwritten extents", p, n)
				}
			}
		})
	}
}
