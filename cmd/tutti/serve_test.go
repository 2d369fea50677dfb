package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
)

// syncBuffer is a subprocess's output, read while it runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startServe runs tutti serve over dirs in a subprocess and waits for its
// ready line.
func startServe(t *testing.T, tmp, socket string, dirs string) (kill func(syscall.Signal), out *syncBuffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "serve", "--dir", dirs, "--socket", socket, "--capacity-blocks", "256")
	out = &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), mainEnv+"=1", "TMPDIR="+tmp)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	waitFor(t, "the ready line", func() string {
		if strings.Contains(out.String(), `"op":"ready"`) {
			return "ready"
		}
		return ""
	})
	return func(sig syscall.Signal) { _ = cmd.Process.Signal(sig); _ = cmd.Wait() }, out
}

// TestServeEnginesAndKills: engine processes share one service; a kill -9
// of an engine mid-run leaves the service serving every committed byte and
// holding nothing of the dead engine's; a kill -9 of the service is
// recovered by the next service, whose engines find every prefix verified.
func TestServeEnginesAndKills(t *testing.T) {
	tmp := t.TempDir()
	dirs := filepath.Join(tmp, "d1") + "," + filepath.Join(tmp, "d2")
	socket := filepath.Join(tmp, "tutti.sock")
	kill, _ := startServe(t, tmp, socket, dirs)
	bench := []string{"serve-bench", "--socket", socket, "--engines", "2", "--duration", "2s", "--prefixes", "8", "--max-blocks", "8"}
	// An engine killed mid-run: its saves in flight never commit and its
	// pins are released (the bench after it verifies every byte).
	victim, _ := tutti(t, tmp, append(bench[:len(bench):len(bench)], "--duration", "30s", "--engine-child", "9")...)
	time.Sleep(1500 * time.Millisecond)
	_ = victim.Process.Kill()
	_ = victim.Wait()
	cmd, out := tutti(t, tmp, bench...)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve-bench: %v\n%s", err, out)
	}
	total := lastTotal(t, out.String())
	if total.Loads == 0 || total.VerifiedBytes == 0 || total.Mismatches != 0 || total.Errors != 0 {
		t.Fatalf("serve-bench total %+v", total)
	}
	kill(syscall.SIGKILL)
	// The service killed -9: a new one recovers the store; what an engine
	// finds is verified byte for byte.
	kill, out2 := startServe(t, tmp, socket, dirs)
	if !strings.Contains(out2.String(), `"recovered_blocks":`) || strings.Contains(out2.String(), `"recovered_blocks":0`) {
		t.Fatalf("restarted service recovered nothing: %s", out2)
	}
	cmd, out = tutti(t, tmp, bench...)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve-bench after the restart: %v\n%s", err, out)
	}
	if total := lastTotal(t, out.String()); total.LoadedBlocks == 0 || total.Mismatches != 0 {
		t.Fatalf("after the restart: %+v", total)
	}
	// A second service on the same directories is refused.
	cmd2, out3 := tutti(t, tmp, "serve", "--dir", dirs, "--socket", filepath.Join(tmp, "other.sock"))
	if err := cmd2.Wait(); err == nil || !strings.Contains(out3.String(), "lock") {
		t.Errorf("a second service on held directories: %v: %s", err, out3)
	}
	kill(syscall.SIGTERM)
}

// lastTotal is serve-bench's total line.
func lastTotal(t *testing.T, out string) engineResult {
	t.Helper()
	var total engineResult
	found := false
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var r engineResult
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.Engine == -1 && strings.Contains(sc.Text(), `"engine":-1`) {
			total, found = r, true
		}
	}
	if !found {
		t.Fatalf("no total line in %s", out)
	}
	return total
}

// TestServeRefusesOtherGeometry: an engine of another KV shape is refused
// at its hello, naming the mismatch.
func TestServeRefusesOtherGeometry(t *testing.T) {
	tmp := t.TempDir()
	socket := filepath.Join(tmp, "tutti.sock")
	kill, _ := startServe(t, tmp, socket, filepath.Join(tmp, "d"))
	defer kill(syscall.SIGTERM)
	prof, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	g := prof.Shape
	g.Layers++
	_, err = runtime.Connect(socket, runtime.Config{Geometry: g, Layout: kvshape.LayoutPerLayer, NumPages: 64})
	if err == nil || !strings.Contains(err.Error(), "geometry") {
		t.Fatalf("connect with another geometry: %v", err)
	}
}
