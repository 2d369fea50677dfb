package objmap

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestKillDuringSaves runs a child process that saves runs in a loop (and
// frees some) and prints each run id once its Commit returned, and each
// freed id once a Sync after the Free returned. The parent kills it with
// SIGKILL at a seeded random moment, reopens the store and checks: every
// acknowledged run is served bit-exact, no run that was never committed is
// served, and Check finds nothing corrupt. Repeated over several seeds on the
// same store, so recovery also meets the leftovers of earlier kills.
func TestKillDuringSaves(t *testing.T) {
	if dir := os.Getenv("OBJMAP_KILL_CHILD"); dir != "" {
		killChild(dir)
		return
	}
	if testing.Short() {
		t.Skip("spawns processes")
	}
	dir := filepath.Join(t.TempDir(), "s")
	m := mustOpen(t, Options{Dirs: []string{dir}, CapacityBytes: 4 << 20, Geometry: tinyGeom, SegmentBytes: 2048})
	m.Close()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	acked := map[RunID]bool{}
	const kills = 16
	for seed := uint64(1); seed <= kills; seed++ {
		rng := rand.New(rand.NewPCG(seed, 99))
		cmd := exec.Command(exe, "-test.run=^TestKillDuringSaves$")
		cmd.Env = append(os.Environ(), "OBJMAP_KILL_CHILD="+dir, fmt.Sprintf("OBJMAP_KILL_SEED=%d", seed))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 1024)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		// Wait until the child has acknowledged a random number of saves
		// (bounded in time), then kill it mid-flight.
		target := 1 + rng.IntN(40)
		deadline := time.After(5 * time.Second)
		seen := 0
	wait:
		for seen < target {
			select {
			case l, ok := <-lines:
				if !ok {
					break wait
				}
				seen += applyAck(t, acked, l)
			case <-deadline:
				break wait
			}
		}
		cmd.Process.Kill()
		for l := range lines {
			applyAck(t, acked, l)
		}
		cmd.Wait()

		m, err := Open(Options{Dirs: []string{dir}})
		if err != nil {
			t.Fatalf("seed %d: reopen after kill: %v", seed, err)
		}
		rep := m.Recovery()
		for id, sure := range acked {
			r, ok := m.Lookup(id)
			if !ok && !sure {
				delete(acked, id) // its free was durable
				continue
			}
			if !ok {
				t.Fatalf("seed %d: acknowledged run %d lost (%v)", seed, id, rep)
			}
			readBack(t, m, r, int(id)%tinyGeom.Layers, r.Chunks())
		}
		if rep.Dropped != 0 {
			t.Fatalf("seed %d: %v", seed, rep)
		}
		if c, err := m.Check(); err != nil || c.Corrupt != 0 {
			t.Fatalf("seed %d: check %v %v", seed, c, err)
		}
		// Runs committed but not yet acknowledged when the kill came may be
		// served (their commit was durable); they are then acknowledged now.
		m.Runs(func(r RunInfo) bool { acked[r.ID] = true; return true })
		t.Logf("seed %d: killed after %d acks; %v", seed, seen, rep)
		m.Close()
	}
}

// applyAck applies one child line ("c ID" committed, "F ID" about to free,
// "f ID" freed durably) and returns 1 for a commit. A run whose free was
// under way at the kill may or may not come back: acked[id] is false then.
func applyAck(t *testing.T, acked map[RunID]bool, l string) int {
	f := strings.Fields(l)
	if len(f) != 2 {
		return 0
	}
	id, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		t.Fatalf("child line %q", l)
	}
	switch f[0] {
	case "c":
		acked[RunID(id)] = true
		return 1
	case "F":
		acked[RunID(id)] = false
	case "f":
		delete(acked, RunID(id))
	}
	return 0
}

func killChild(dir string) {
	seed, _ := strconv.ParseUint(os.Getenv("OBJMAP_KILL_SEED"), 10, 64)
	rng := rand.New(rand.NewPCG(seed, 7))
	m, err := Open(Options{Dirs: []string{dir}, SegmentBytes: 2048})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	t := &testing.T{}
	var live []RunID
	m.Runs(func(r RunInfo) bool { live = append(live, r.ID); return true })
	for i := 0; ; i++ {
		if len(live) > 0 && rng.IntN(4) == 0 {
			k := rng.IntN(len(live))
			id := live[k]
			live = append(live[:k], live[k+1:]...)
			fmt.Printf("F %d\n", id)
			if m.Free(id) != nil || m.Sync() != nil {
				os.Exit(3)
			}
			fmt.Printf("f %d\n", id)
			continue
		}
		res, err := m.Allocate(1 + rng.IntN(4))
		if err != nil {
			// Full: free the oldest to make room.
			if len(live) == 0 {
				os.Exit(4)
			}
			id := live[0]
			live = live[1:]
			fmt.Printf("F %d\n", id)
			if m.Free(id) != nil || m.Sync() != nil {
				os.Exit(3)
			}
			fmt.Printf("f %d\n", id)
			continue
		}
		var reqs []CommitRequest
		for _, r := range res {
			reqs = append(reqs, writeRun(t, m, r))
		}
		if err := m.Commit(reqs); err != nil {
			os.Exit(5)
		}
		for _, r := range res {
			live = append(live, r.ID)
			fmt.Printf("c %d\n", r.ID)
		}
	}
}
