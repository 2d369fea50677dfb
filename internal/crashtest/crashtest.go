// Package crashtest is the protocol of the SIGKILL crash tests: the test
// binary re-executes itself as a child that saves chains and reports on a
// pipe (file descriptor 3) "ready" once open, "try CHAIN" before a save and
// "ok CHAIN" when the save returned success; the parent kills the child with
// SIGKILL a chosen time after "ready" and gets back what was tried and what
// was acknowledged. Any other line is the child's fatal error.
//
// Beyond the protocol it holds what runtime's and runtime/tp's crash tests
// share: the child's seeded save loop (Reporter.SaveLoop), the parent's
// seeded kill points (Plan.Run) and the checks after each restart
// (Point.CheckSaved, Point.CheckTried). The tests supply their store: how to
// open it, fill and save a chain, and restore and verify one. Tests only; it
// must not be imported by package code.
package crashtest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Reporter is the child's side: each line is one write, so whatever the
// parent read was written before the kill.
type Reporter struct{ w *bufio.Writer }

// NewReporter reports on file descriptor 3 (the parent's pipe).
func NewReporter() *Reporter { return &Reporter{w: bufio.NewWriter(os.NewFile(3, "report"))} }

// Say writes one line and flushes it.
func (r *Reporter) Say(format string, args ...any) {
	fmt.Fprintf(r.w, format+"\n", args...)
	r.w.Flush()
}

// Ready, Try and OK write the protocol's lines.
func (r *Reporter) Ready()             { r.Say("ready") }
func (r *Reporter) Try(chain []uint64) { r.Say("try %s", FormatChain(chain)) }
func (r *Reporter) OK(chain []uint64)  { r.Say("ok %s", FormatChain(chain)) }

// FormatChain writes a chain as comma-separated hex ids.
func FormatChain(c []uint64) string {
	parts := make([]string, len(c))
	for i, id := range c {
		parts[i] = strconv.FormatUint(id, 16)
	}
	return strings.Join(parts, ",")
}

// ParseChain reads what FormatChain wrote.
func ParseChain(s string) ([]uint64, error) {
	var c []uint64
	for _, p := range strings.Split(s, ",") {
		id, err := strconv.ParseUint(p, 16, 64)
		if err != nil {
			return nil, err
		}
		c = append(c, id)
	}
	return c, nil
}

// RunChild runs the test named test of this binary with env added, kills it
// with SIGKILL delay after it said "ready", and returns the chains it tried
// and those it acknowledged. A child that exits before the kill, or reports
// anything else, fails t (name says which child in the message).
func RunChild(t testing.TB, name, test string, env []string, delay time.Duration) (tried, ok [][]uint64) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	cmd.ExtraFiles = []*os.File{w}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var timer <-chan time.Time
	killed := false
	for done := false; !done; {
		select {
		case <-timer:
			_ = cmd.Process.Signal(syscall.SIGKILL)
			killed, timer = true, nil
		case line, more := <-lines:
			switch {
			case !more:
				done = true
			case line == "ready":
				timer = time.After(delay)
			case strings.HasPrefix(line, "try "), strings.HasPrefix(line, "ok "):
				c, err := ParseChain(line[strings.IndexByte(line, ' ')+1:])
				if err != nil {
					_ = cmd.Process.Kill()
					t.Fatalf("%s: line %q: %v", name, line, err)
				}
				if line[0] == 't' {
					tried = append(tried, c)
				} else {
					ok = append(ok, c)
				}
			default:
				_ = cmd.Process.Kill()
				t.Fatalf("%s: %s", name, line)
			}
		}
	}
	err = cmd.Wait()
	r.Close()
	if !killed {
		t.Fatalf("%s exited before the kill: %v", name, err)
	}
	return tried, ok
}
