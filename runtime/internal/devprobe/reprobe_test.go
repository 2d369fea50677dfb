package devprobe

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestReprobeReads: the default re-probe reads committed bytes of a real
// file with O_DIRECT and returns a rate; a file it cannot read is an error.
func TestReprobeReads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pool")
	b := make([]byte, 8<<20)
	for i := range b {
		b[i] = byte(i * 7)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Skipf("O_DIRECT: %v", err)
	}
	defer unix.Close(fd)
	rate, err := Reads(fd, 1<<20, 4<<20, 512<<10, reprobeBudget)
	if err != nil || !(rate > 0) {
		t.Fatalf("rate %g, err %v", rate, err)
	}
	if _, err := Reads(-1, 0, 4<<20, 512<<10, reprobeBudget); err == nil {
		t.Fatal("bad fd: no error")
	}
}

// fakeModels is the scheduler's models as a Reprober sees them.
type fakeModels struct {
	mu    sync.Mutex
	stale bool
	seen  int
	rate  float64
}

func (m *fakeModels) ReadsStale(int, time.Duration) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stale
}
func (m *fakeModels) ReadsSeen(int) { m.mu.Lock(); m.seen++; m.mu.Unlock() }
func (m *fakeModels) RemeasureReads(_ int, bps float64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rate = bps
	return nil
}

// TestReprober: a stale device is re-probed once, in the background, its
// rate set in the models; a fresh one is not; a run too short to measure
// is a skip; a failure is counted with the device's name; a closing store
// (begin fails) reads nothing.
func TestReprober(t *testing.T) {
	target := Target{Device: 3, FD: 9, Path: "/pool/3", Offset: 1 << 20, Length: 16 << 20}
	var mu sync.Mutex
	var calls int
	var fail error
	probe := func(fd int, off, n, op int64, _ time.Duration) (float64, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if fd != 9 || off != 1<<20 || n%op != 0 || n < MinOps*op {
			t.Errorf("probe of fd %d at %d: %d bytes in ops of %d", fd, off, n, op)
		}
		return 4e9, fail
	}
	m := &fakeModels{}
	rp := NewReprober(probe, time.Millisecond, m)
	ended := make(chan struct{}, 4)
	begin, end := func() error { return nil }, func() { ended <- struct{}{} }

	rp.Maybe(target, begin, end) // fresh: nothing
	m.stale = true
	rp.Maybe(target, func() error { return errors.New("closing") }, end)
	rp.Maybe(target, begin, end)
	<-ended
	if done, failed, skipped, _ := rp.Stats(); done != 1 || failed != 0 || skipped != 0 || m.rate != 4e9 || calls != 1 {
		t.Fatalf("stats %d %d %d, rate %g, %d probes", done, failed, skipped, m.rate, calls)
	}
	short := target
	short.Length = 1 << 20
	rp.Maybe(short, begin, end)
	if _, _, skipped, _ := rp.Stats(); skipped != 1 {
		t.Fatalf("a 1 MiB run was not skipped: %d", skipped)
	}
	mu.Lock()
	fail = errors.New("injected")
	mu.Unlock()
	rp.Maybe(target, begin, end)
	<-ended
	if _, failed, _, msg := rp.Stats(); failed != 1 || !strings.Contains(msg, "device 3 (/pool/3): injected") {
		t.Fatalf("failed %d, %q", failed, msg)
	}
	var none *Reprober
	none.Maybe(target, begin, end)
	if d, f, s, msg := none.Stats(); d+f+s != 0 || msg != "" {
		t.Fatal("a nil Reprober counted")
	}
}
