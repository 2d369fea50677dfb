package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tutti-io/tutti/runtime"
)

// runNodeProc runs `tutti node` in a subprocess on stdin and returns its
// replies after the ready line, its stderr and its exit status.
func runNodeProc(t *testing.T, stdin *os.File, input []byte, args ...string) ([]nodeReply, string, int) {
	t.Helper()
	tmp := t.TempDir()
	cmd := exec.Command(os.Args[0], append([]string{"node", "--dir", filepath.Join(tmp, "store")}, args...)...)
	cmd.Env = append(os.Environ(), mainEnv+"=1", "TMPDIR="+tmp)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if stdin != nil {
		cmd.Stdin = stdin
	} else {
		cmd.Stdin = bytes.NewReader(input)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("node did not end within 60 s; stderr:\n%s", stderr.String())
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var replies []nodeReply
	dec := json.NewDecoder(&stdout)
	for dec.More() {
		var r nodeReply
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("reply %d: %v; stdout:\n%s", len(replies), err, stdout.String())
		}
		if r.Op != "ready" {
			replies = append(replies, r)
		}
	}
	return replies, stderr.String(), code
}

// TestNodeAnswersEveryLine: a line past the limit, and bytes with no
// newline at all, get an error reply naming the limit, and the lines after
// them are answered.
func TestNodeAnswersEveryLine(t *testing.T) {
	long := bytes.Repeat([]byte("x"), nodeMaxLineBytes+1)
	atLimit := bytes.Repeat([]byte("y"), nodeMaxLineBytes)
	garbage := make([]byte, 2*nodeMaxLineBytes)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range garbage {
		garbage[i] = byte(r.IntN(255) + 1)
		if garbage[i] == '\n' {
			garbage[i] = 0
		}
	}
	join := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	for _, tc := range []struct {
		name  string
		input []byte
		want  []string // per reply: "op:OP" or "error:SUBSTRING"
	}{
		{"long line between two", join([]byte("stats\n"), long, []byte("\nstats\n")),
			[]string{"op:stats", "error:1048576-byte limit", "op:stats"}},
		{"line at the limit is read", join(atLimit, []byte("\nstats\n")),
			[]string{"error:unknown op", "op:stats"}},
		{"garbage without a newline", join([]byte("stats\n"), garbage),
			[]string{"op:stats", "error:1048576-byte limit"}},
		{"garbage then a line", join(garbage, []byte("\nstats")),
			[]string{"error:1048576-byte limit", "op:stats"}},
		{"last line without a newline", []byte("stats\nstats"), []string{"op:stats", "op:stats"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			replies, stderr, code := runNodeProc(t, nil, tc.input)
			if code != 0 {
				t.Fatalf("exit %d at the end of its input; stderr:\n%s", code, stderr)
			}
			if len(replies) != len(tc.want) {
				t.Fatalf("%d replies %+v, want %d (%v)", len(replies), replies, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				kind, s, _ := strings.Cut(w, ":")
				if kind == "op" && (replies[i].Op != s || replies[i].Error != "") || kind == "error" && !strings.Contains(replies[i].Error, s) {
					t.Errorf("reply %d: %+v, want %s", i, replies[i], w)
				}
			}
		})
	}
}

// TestNodeStats: the stats reply is the store's runtime.Stats, nested by
// subsystem, after a save and a load of two blocks.
func TestNodeStats(t *testing.T) {
	bt := tinyBlockTokens(t)
	var in strings.Builder
	for _, op := range []string{"save", "load"} {
		in.WriteString(op)
		for _, tok := range tokensFor(1, 2, bt) {
			fmt.Fprintf(&in, " %d", tok)
		}
		in.WriteByte('\n')
	}
	in.WriteString("stats\n")
	replies, stderr, code := runNodeProc(t, nil, []byte(in.String()))
	if code != 0 || len(replies) != 3 {
		t.Fatalf("exit %d, replies %+v; stderr:\n%s", code, replies, stderr)
	}
	st := replies[2].Stats
	if replies[0].Stats != nil || st == nil || st.Saves.SavedBlocks != 2 || st.Loads.RestoredBlocks != 2 ||
		st.Map.LiveRuns != 1 || st.Index.Blocks != 2 || st.Events.Enabled || st.Path.Used != runtime.PathCPU {
		t.Fatalf("stats reply %+v", replies[2])
	}
}

// TestNodeReadErrorExits: stdin that cannot be read ends the node with a
// non-zero status naming stdin.
func TestNodeReadErrorExits(t *testing.T) {
	dir, err := os.Open(t.TempDir()) // read(2) on a directory: EISDIR
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	_, stderr, code := runNodeProc(t, dir, nil)
	if code == 0 || !strings.Contains(stderr, "stdin") {
		t.Fatalf("exit %d, stderr %q: want non-zero naming stdin", code, stderr)
	}
}

// TestNodeFlagsRefused: flags that would make every request fail, or
// advertise an address no router can reach, are refused at start, naming
// the flag.
func TestNodeFlagsRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"--pages", "1"}, "--pages"}, // tiny's chain block is more than one page
		{[]string{"--pages", "2000000"}, "--pages"},
		{[]string{"--capacity-blocks", "0"}, "--capacity-blocks"},
		{[]string{"--kv-events", "tcp://0.0.0.0:5557"}, "--kv-events"},
		{[]string{"--kv-events", "tcp://[::]:5557"}, "--kv-events"},
		{[]string{"--kv-events", "tcp://*:5557"}, "--kv-events"},
		{[]string{"--kv-events", "tcp://:5557"}, "--kv-events"},
		{[]string{"--kv-events", "tcp://127.0.0.1:5557?replay=tcp://0.0.0.0:5558"}, "--kv-events"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"node", "--dir", t.TempDir()}, tc.args...), &stdout, &stderr)
		if last := lastLine(stderr.String()); code == 0 || !strings.Contains(last, tc.flag) {
			t.Errorf("%v: exit %d, last line %q: want an error naming %s", tc.args, code, last, tc.flag)
		}
	}
}
