package main

import (
	"bytes"
	"flag"
	"sort"
	"strings"
	"testing"
	"time"
)

// numericFlags returns every command's numeric flags (name → flag type),
// read from the flag sets the commands build (flagSetCreated) when asked
// for -h.
func numericFlags(t *testing.T) map[string]map[string]string {
	t.Helper()
	var sets []*flag.FlagSet
	flagSetCreated = func(fs *flag.FlagSet) { sets = append(sets, fs) }
	defer func() { flagSetCreated = nil }()
	out := map[string]map[string]string{}
	for name := range commands {
		sets = sets[:0]
		var stdout, stderr bytes.Buffer
		run([]string{name, "-h"}, &stdout, &stderr)
		if len(sets) != 1 {
			t.Fatalf("%s -h built %d flag sets, want 1", name, len(sets))
		}
		out[name] = map[string]string{}
		sets[0].VisitAll(func(f *flag.Flag) {
			g, ok := f.Value.(flag.Getter)
			if !ok {
				return
			}
			switch g.Get().(type) {
			case int, int64:
				out[name][f.Name] = "int"
			case float64:
				out[name][f.Name] = "float"
			case time.Duration:
				out[name][f.Name] = "duration"
			case uint, uint64:
				out[name][f.Name] = "uint"
			}
		})
	}
	return out
}

// TestNegativeNumericFlags: every numeric flag of every command, given a
// negative value (and every float flag NaN), is an error naming the flag,
// before the command does anything. The walk covers flags added later too.
func TestNegativeNumericFlags(t *testing.T) {
	all := numericFlags(t)
	// The cases first reproduced by hand must be among those walked.
	for _, f := range []string{"capacity-blocks", "slo-ms", "requests", "tutti-save-bound-ms"} {
		if _, ok := all["replay"][f]; !ok {
			t.Fatalf("replay has no numeric flag --%s", f)
		}
	}
	if _, ok := all["devbench"]["runtime"]; !ok {
		t.Fatal("devbench has no duration flag --runtime")
	}
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)
	tried := 0
	for _, cmd := range names {
		for fl, kind := range all[cmd] {
			vals := map[string][]string{"int": {"-3"}, "float": {"-1", "NaN", "-Inf"}, "duration": {"-3s"}, "uint": {"-3"}}[kind]
			for _, v := range vals {
				var stdout, stderr bytes.Buffer
				start := time.Now()
				code := run([]string{cmd, "--" + fl + "=" + v}, &stdout, &stderr)
				msg := stderr.String()
				if code == 0 || !strings.Contains(msg, fl) || !strings.Contains(msg, v) {
					t.Errorf("%s --%s=%s: exit %d, stderr %q: want an error naming the flag and value", cmd, fl, v, code, msg)
				}
				if d := time.Since(start); d > 10*time.Second {
					t.Errorf("%s --%s=%s: took %v: the check must come before any work", cmd, fl, v, d)
				}
				tried++
			}
		}
	}
	if tried < 30 {
		t.Fatalf("only %d flag values tried", tried)
	}
	t.Logf("%d negative or non-finite values of %d commands' numeric flags refused", tried, len(names))
}

// TestCheckNumericFlags: the rule itself, on a flag set of each type; a flag
// left at a negative default is not an error.
func TestCheckNumericFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		bad  string
	}{
		{nil, ""},
		{[]string{"--n", "0", "--x", "0", "--d", "0s", "--i64", "0"}, ""},
		{[]string{"--n", "5", "--x", "2.5", "--d", "1s"}, ""},
		{[]string{"--n", "-1"}, "--n -1"},
		{[]string{"--x", "-0.5"}, "--x -0.5"},
		{[]string{"--x", "+Inf"}, "--x +Inf"},
		{[]string{"--d", "-1ms"}, "--d -1ms"},
		{[]string{"--i64", "-7"}, "--i64 -7"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(&bytes.Buffer{})
		fs.Int("n", -1, "")
		fs.Float64("x", 0, "")
		fs.Duration("d", 0, "")
		fs.Int64("i64", 0, "")
		fs.String("s", "-1", "")
		err := parseFlags(fs, tc.args)
		switch {
		case tc.bad == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
			t.Errorf("%v: error %v, want one naming %q", tc.args, err, tc.bad)
		}
	}
}
