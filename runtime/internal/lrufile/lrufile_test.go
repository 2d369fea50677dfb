package lrufile

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRoundTrip: what Write keeps, Read gives back; a missing file is no
// note, a torn, oversized or foreign one is, and gives no ids.
func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if ids, note := Read(dir, 10); ids != nil || note != "" {
		t.Fatalf("missing file: %v %q", ids, note)
	}
	want := []uint64{3, 1, 2}
	if err := Write(dir, want); err != nil {
		t.Fatal(err)
	}
	if ids, note := Read(dir, 10); !slices.Equal(ids, want) || note != "" {
		t.Fatalf("read %v %q, want %v", ids, note, want)
	}
	if ids, note := Read(dir, 2); ids != nil || !strings.Contains(note, "more than") {
		t.Fatalf("more ids than asked for: %v %q", ids, note)
	}
	p := filepath.Join(dir, Name)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"torn", b[:len(b)-1]},
		{"flipped", append(append([]byte{}, b[:lruHeaderSize]...), append([]byte{b[lruHeaderSize] ^ 1}, b[lruHeaderSize+1:]...)...)},
		{"foreign", []byte("not an lru file at all, no")},
	} {
		if err := os.WriteFile(p, tc.b, 0o600); err != nil {
			t.Fatal(err)
		}
		if ids, note := Read(dir, 10); ids != nil || note == "" {
			t.Errorf("%s: read %v, note %q", tc.name, ids, note)
		}
	}
}
