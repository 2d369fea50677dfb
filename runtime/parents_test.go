package runtime

import (
	"testing"

	"github.com/tutti-io/tutti/objmap"
)

// FuzzParentLog: the parent log decoder never panics, keeps exactly the
// records before the first bad one, and round-trips what it keeps.
func FuzzParentLog(f *testing.F) {
	var rec [parentRecBytes]byte
	var good []byte
	for i, p := range []parentRef{{}, {id: 7, has: true}, {id: 1 << 60, has: true}} {
		encodeParent(rec[:], objmap.RunID(i+1), p)
		good = append(good, rec[:]...)
	}
	f.Add(good)
	f.Add(good[:len(good)-3])
	f.Add([]byte{})
	bad := append([]byte(nil), good...)
	bad[parentRecBytes+9] ^= 1
	f.Add(bad)
	f.Fuzz(func(t *testing.T, b []byte) {
		got := readParents(b)
		if len(got) > len(b)/parentRecBytes {
			t.Fatalf("%d records from %d bytes", len(got), len(b))
		}
		// Re-encoding what was kept decodes to the same map.
		var out []byte
		var r [parentRecBytes]byte
		for id, p := range got {
			encodeParent(r[:], id, p)
			out = append(out, r[:]...)
		}
		again := readParents(out)
		if len(again) != len(got) {
			t.Fatalf("round trip: %d records, then %d", len(got), len(again))
		}
		for id, p := range got {
			if again[id] != p {
				t.Fatalf("round trip of run %d: %+v then %+v", id, p, again[id])
			}
		}
	})
}

func TestParentLogStopsAtDamage(t *testing.T) {
	var rec [parentRecBytes]byte
	var b []byte
	for i := 1; i <= 3; i++ {
		encodeParent(rec[:], objmap.RunID(i), parentRef{id: uint64(i * 10), has: i > 1})
		b = append(b, rec[:]...)
	}
	if got := readParents(b); len(got) != 3 || got[2] != (parentRef{id: 20, has: true}) || got[1].has {
		t.Fatalf("intact log: %+v", got)
	}
	b[2*parentRecBytes+3] ^= 0x40 // damage the third record
	if got := readParents(b); len(got) != 2 {
		t.Fatalf("damaged third record: kept %d records, want 2", len(got))
	}
	if got := readParents(b[:2*parentRecBytes+10]); len(got) != 2 {
		t.Fatalf("torn third record: kept %d records, want 2", len(got))
	}
}
