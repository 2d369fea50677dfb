package main

import (
	"errors"
	"fmt"
	"testing"

	"github.com/tutti-io/tutti/objmap"
)

func TestHandleTable(t *testing.T) {
	tb := newTable()
	a, err := tb.add(kindStore, "store")
	if err != nil {
		t.Fatal(err)
	}
	b, err := tb.add(kindLoad, "load")
	if err != nil {
		t.Fatal(err)
	}
	if a == 0 || b == 0 || a == b {
		t.Fatalf("handles %#x %#x: want distinct and non-zero", a, b)
	}
	if v, err := tb.get(a, kindStore); err != nil || v != "store" {
		t.Fatalf("get store: %v %v", v, err)
	}
	cases := []struct {
		name string
		h    uint64
		k    kind
	}{
		{"zero", 0, kindStore},
		{"wrong kind", b, kindStore},
		{"wrong kind save", a, kindSave},
		{"never issued", uint64(kindStore)<<kindShift | 12345, kindStore},
		{"garbage kind", 0xff << kindShift, kindLoad},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := tb.get(c.h, c.k)
			if classify(err) != errBadHandle {
				t.Fatalf("get(%#x, %s) = %v, want TUTTI_ERR_BAD_HANDLE", c.h, c.k, err)
			}
		})
	}
	if _, err := tb.take(b, kindLoad); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.take(b, kindLoad); classify(err) != errBadHandle {
		t.Fatalf("second take: %v, want TUTTI_ERR_BAD_HANDLE", err)
	}
	// Handles are never reused: the next one differs from the released one.
	c, _ := tb.add(kindLoad, "again")
	if c == b {
		t.Fatalf("handle %#x reused", c)
	}
	if tb.len() != 2 {
		t.Fatalf("len %d, want 2", tb.len())
	}
}

func TestClassify(t *testing.T) {
	base := errorf(errOutOfRange, "page 9")
	for _, c := range []struct {
		err  error
		want status
	}{
		{nil, statusOK},
		{base, errOutOfRange},
		{fmt.Errorf("tutti_load: %w", base), errOutOfRange},
		{errors.New("something new"), errInternal},
		{fmt.Errorf("runtime: open: %w", fmt.Errorf("%w: capacity", objmap.ErrSettingsMismatch)), errSettings},
		{fmt.Errorf("runtime: open: %w", objmap.ErrMissingDir), errSettings},
	} {
		if got := classify(c.err); got != c.want {
			t.Errorf("classify(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	if s := status(99).String(); s != "tutti_status(99)" {
		t.Errorf("unknown status prints %q", s)
	}
}
