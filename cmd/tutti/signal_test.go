package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tutti-io/tutti/objmap"
)

// TestMain lets a test run the tutti command itself in a subprocess: the
// test binary, re-executed with mainEnv set, is tutti.
func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

const mainEnv = "TUTTI_TEST_RUN_MAIN"

// tutti starts the command with args in a subprocess, TMPDIR set to tmp.
func tutti(t *testing.T, tmp string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = append(os.Environ(), mainEnv+"=1", "TMPDIR="+tmp)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd, &out
}

// waitFor polls until found returns a path or the deadline passes.
func waitFor(t *testing.T, what string, found func() string) string {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if p := found(); p != "" {
			return p
		}
	}
	t.Fatalf("%s never appeared", what)
	return ""
}

func glob(pattern string) func() string {
	return func() string {
		m, _ := filepath.Glob(pattern)
		if len(m) > 0 {
			return m[0]
		}
		return ""
	}
}

// terminate sends SIGTERM and waits: the exit status must be 128+SIGTERM.
func terminate(t *testing.T, cmd *exec.Cmd, out *bytes.Buffer) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 128+int(syscall.SIGTERM) {
		t.Fatalf("after SIGTERM: %v, want exit status %d; output:\n%s", err, 128+int(syscall.SIGTERM), out)
	}
	if !strings.Contains(out.String(), "interrupted by terminated") {
		t.Fatalf("no interruption message:\n%s", out)
	}
}

// entries lists dir's names.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// TestReplaySIGTERMCleansUp: a replay on its default temporary store, sent
// SIGTERM while a backend runs, removes the store (and its report
// directory, when no backend finished) and exits 143.
func TestReplaySIGTERMCleansUp(t *testing.T) {
	tmp := t.TempDir()
	cmd, out := tutti(t, tmp, "replay", "--no-ceiling", "--no-ebpf", "--backends", "tutti-cpu,per-block,pagecache,cufile")
	waitFor(t, "the temporary store", glob(filepath.Join(tmp, "tutti-replay-store-*", "*", "*")))
	terminate(t, cmd, out)
	for _, n := range entries(t, tmp) {
		if strings.HasPrefix(n, "tutti-replay-store-") {
			t.Fatalf("temporary store %s left behind; output:\n%s", n, out)
		}
		if strings.HasPrefix(n, "tutti-replay-report-") && len(entries(t, filepath.Join(tmp, n))) == 0 {
			t.Fatalf("empty report directory %s left behind", n)
		}
	}
}

// TestTwoReplaysOneDir: while one replay runs on --dir D, a second on D
// fails at once naming the first's pid (before it removes anything: the
// root's lock is the first thing a replay takes); the
// first, sent SIGTERM, leaves D as it found it but for D's lock file.
func TestTwoReplaysOneDir(t *testing.T) {
	tmp, dir := t.TempDir(), t.TempDir()
	first, out := tutti(t, tmp, "replay", "--dir", dir, "--out", filepath.Join(tmp, "report"), "--no-ceiling", "--no-ebpf",
		"--backends", "tutti-cpu,per-block,pagecache,cufile")
	waitFor(t, "the first replay's backend directory", glob(filepath.Join(dir, "*", "*")))
	var stdout, stderr bytes.Buffer
	code := run([]string{"replay", "--dir", dir, "--no-ceiling", "--no-ebpf", "--backends", "tutti-cpu,per-block"}, &stdout, &stderr)
	want := fmt.Sprintf("pid %d", first.Process.Pid)
	if code == 0 || !strings.Contains(stderr.String(), objmap.ErrLocked.Error()) || !strings.Contains(stderr.String(), want) {
		t.Fatalf("second replay: exit %d, %q: want it refused naming %s", code, stderr.String(), want)
	}
	terminate(t, first, out)
	if n := entries(t, dir); len(n) > 1 || len(n) == 1 && n[0] != "LOCK" {
		t.Fatalf("left in --dir after SIGTERM: %v", n)
	}
}

// TestDevbenchSIGTERMCleansUp: devbench sent SIGTERM while it writes or
// measures its test file removes the file and exits 143.
func TestDevbenchSIGTERMCleansUp(t *testing.T) {
	tmp, dir := t.TempDir(), t.TempDir()
	cmd, out := tutti(t, tmp, "devbench", "--path", dir, "--size", "64MiB", "--bs", "4k", "--qd", "1", "--engines", "pread",
		"--ops", "randread", "--runtime", "30s")
	waitFor(t, "the test file", glob(filepath.Join(dir, "tutti-devbench-*.dat")))
	terminate(t, cmd, out)
	if n := entries(t, dir); len(n) != 0 {
		t.Fatalf("left in --path after SIGTERM: %v; output:\n%s", n, out)
	}
	if !strings.Contains(out.String(), "devbench "+dir) {
		t.Fatalf("no progress line without a terminal:\n%s", out)
	}
}

// TestReplayOutCheckedFirst: an --out that cannot be written is refused
// before the replay runs (no backend directory is made).
func TestReplayOutCheckedFirst(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{file, filepath.Join(file, "below")} {
		var stdout, stderr bytes.Buffer
		code := run([]string{"replay", "--dir", dir, "--out", out, "--no-ceiling", "--no-ebpf", "--backends", "dram"}, &stdout, &stderr)
		if code == 0 || !strings.Contains(stderr.String(), "--out "+out) {
			t.Fatalf("--out %s: exit %d, %q", out, code, stderr.String())
		}
		if n := entries(t, dir); len(n) != 0 {
			t.Fatalf("--out %s: the replay ran first: %v in --dir", out, n)
		}
	}
}

// TestGpubenchJSONCheckedFirst: gpubench's --json file is checked before
// any measurement.
func TestGpubenchJSONCheckedFirst(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(file, "rows.json")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"gpubench", "--json", bad}, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), "--json "+bad) {
		t.Fatalf("exit %d, %q: want --json %s refused", code, stderr.String(), bad)
	}
}

// TestGpubenchSIGTERMCleansUp: gpubench sent SIGTERM while a store path
// runs finishes that path's cleanup (its store directory removed), starts
// no other, and exits 143.
func TestGpubenchSIGTERMCleansUp(t *testing.T) {
	tmp, dir := t.TempDir(), t.TempDir()
	cmd, out := tutti(t, tmp, "gpubench", "--paths", "store-cpu,store-cpu", "--dir", dir, "--model", "tiny", "--tokens", "262144", "--no-ceiling")
	waitFor(t, "the store directory", glob(filepath.Join(dir, "tutti-gpubench-store-cpu-*")))
	terminate(t, cmd, out)
	if n := entries(t, dir); len(n) != 0 {
		t.Fatalf("left in --dir after SIGTERM: %v; output:\n%s", n, out)
	}
	if strings.Count(out.String(), "store-cpu save ") > 1 { // the first save row of each path (not save-again)
		t.Fatalf("the second path ran after SIGTERM:\n%s", out)
	}
}
