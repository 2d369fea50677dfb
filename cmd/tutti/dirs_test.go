package main

import (
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestParseDirs(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		err  []string // each must appear in the error
	}{
		{in: "", want: nil},
		{in: "/a", want: []string{"/a"}},
		{in: "/m0,/m1,/m2,/m3", want: []string{"/m0", "/m1", "/m2", "/m3"}},
		{in: " /a/ , b/../c ", want: []string{"/a", "c"}},
		{in: "/a,,/b", err: []string{"entry 2 is empty"}},
		{in: "/a,", err: []string{"entry 2 is empty"}},
		{in: ",/a", err: []string{"entry 1 is empty"}},
		{in: "/a,/b,/a/", err: []string{`entry 3 ("/a/") is entry 1 again`}},
		{in: ",/a,/a", err: []string{"entry 1 is empty", `entry 3 ("/a") is entry 2 again`}},
	} {
		got, err := parseDirs(tc.in)
		if len(tc.err) > 0 {
			if err == nil {
				t.Fatalf("%q: no error, got %q", tc.in, got)
			}
			for _, e := range tc.err {
				if !strings.Contains(err.Error(), e) {
					t.Fatalf("%q: error %q does not say %q", tc.in, err, e)
				}
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Fatalf("%q: got %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// TestDirsFlag: --dir repeated adds up, and the rules of one value hold
// across values.
func TestDirsFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
		err  string
	}{
		{args: []string{"--dir", "/a,/b"}, want: []string{"/a", "/b"}},
		{args: []string{"--dir", "/a", "--dir", "/b,/c"}, want: []string{"/a", "/b", "/c"}},
		{args: []string{"--dir", "/a", "--dir", "/a/"}, err: `entry 2 ("/a/") is entry 1 again`},
		{args: []string{"--dir", "/a", "--dir", ""}, err: "entry 2 is empty"},
		{args: nil, want: nil},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var d dirsFlag
		fs.Var(&d, "dir", "")
		err := fs.Parse(tc.args)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want one saying %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(d.dirs, tc.want) {
			t.Errorf("%q: got %q, %v; want %q", tc.args, d.dirs, err, tc.want)
		}
	}
}
