package objmap

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"
)

// TestGroupCommitConcurrent commits from several goroutines at once (with
// frees and checkpoints interleaved) and checks that every acknowledged
// commit survives a reopen. Under -race it also checks the locking.
func TestGroupCommitConcurrent(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s")
	o := testOpts(t, dir)
	o.CapacityBytes = 8 << 20
	o.SegmentBytes = 2048
	m := mustOpen(t, o)
	const workers, each = 6, 25
	var mu sync.Mutex
	live := map[RunID]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []RunID
			for i := 0; i < each; i++ {
				res, err := m.Allocate(1 + i%3)
				if err != nil {
					errs <- err
					return
				}
				var reqs []CommitRequest
				for _, r := range res {
					reqs = append(reqs, writeRun(t, m, r))
				}
				if err := m.Commit(reqs); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for _, r := range res {
					live[r.ID] = true
					mine = append(mine, r.ID)
				}
				mu.Unlock()
				if i%4 == 3 {
					id := mine[0]
					mine = mine[1:]
					if err := m.Free(id); err != nil {
						errs <- fmt.Errorf("free %d: %w", id, err)
						return
					}
					mu.Lock()
					delete(live, id)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s := m.Stats()
	t.Logf("%d commits, %d frees, %d journal syncs, %d checkpoints", s.Commits, s.Frees, s.JournalSyncs, s.Checkpoints)
	if s.LiveRuns != len(live) {
		t.Fatalf("%d live runs counted, %d committed and not freed", s.LiveRuns, len(live))
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m = mustOpen(t, o)
	defer m.Close()
	if rep := m.Recovery(); rep.Recovered != len(live) || rep.Dropped != 0 {
		t.Fatalf("report %v, want %d live", rep, len(live))
	}
	for id := range live {
		if _, ok := m.Lookup(id); !ok {
			t.Fatalf("run %d lost", id)
		}
	}
	if rep, err := m.Check(); err != nil || rep.Corrupt != 0 {
		t.Fatalf("check %v %v", rep, err)
	}
}
