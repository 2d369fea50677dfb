package prewrite

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tutti-io/tutti/objmap"
)

// fakePool has left bytes unwritten and fails every write with err when set.
type fakePool struct {
	mu            sync.Mutex
	left, written int64
	err           error
	calls         int
	note          string
}

func (p *fakePool) Prewrite(maxBytes int64) (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.err != nil {
		return 0, p.err
	}
	n := min(maxBytes, p.left)
	p.left -= n
	p.written += n
	return n, nil
}

func (p *fakePool) PrewriteLeftBytes() int64 { p.mu.Lock(); defer p.mu.Unlock(); return p.left }
func (p *fakePool) PrewrittenBytes() int64   { p.mu.Lock(); defer p.mu.Unlock(); return p.written }
func (p *fakePool) PrewriteNote() string     { return p.note }

// TestPrewrite: the prewrite writes while the store is idle, waits while an
// operation is in flight, ends Done with nothing left; it stops after
// maxErrors failures, ends at once on a closed map, and is Off or Done
// without starting when asked to or when there is nothing to write.
func TestPrewrite(t *testing.T) {
	pool := &fakePool{left: 3*stepBytes + 1}
	p := Start(pool, false, "")
	p.Begin()
	time.Sleep(3 * Idle)
	if pool.PrewrittenBytes() != 0 {
		t.Fatal("wrote while an operation was in flight")
	}
	p.End()
	if !p.Wait(10 * time.Second) {
		t.Fatalf("not done: %+v", p.Stats())
	}
	if st := p.Stats(); st.State != Done || st.LeftBytes != 0 || st.WrittenBytes != 3*stepBytes+1 || st.Errors != 0 {
		t.Fatalf("done: %+v", st)
	}
	p.Stop()

	failing := &fakePool{left: 1 << 20, err: errors.New("EIO")}
	p = Start(failing, false, "")
	if !p.Wait(10 * time.Second) {
		t.Fatalf("not stopped: %+v", p.Stats())
	}
	if st := p.Stats(); st.State != Stopped || st.Errors != maxErrors || st.LastError != "EIO" || st.Reason == "" {
		t.Fatalf("stopped: %+v", st)
	}

	closed := &fakePool{left: 1 << 20, err: objmap.ErrClosed}
	p = Start(closed, false, "")
	if !p.Wait(10*time.Second) || closed.calls != 1 {
		t.Fatalf("a closed map: %d writes, %+v", closed.calls, p.Stats())
	}

	if st := Start(&fakePool{left: 1}, true, "turned off").Stats(); st.State != Off || st.Reason != "turned off" {
		t.Fatalf("off: %+v", st)
	}
	if st := Start(&fakePool{}, false, "").Stats(); st.State != Done {
		t.Fatalf("nothing to write: %+v", st)
	}
	if st := Start(&fakePool{note: "no extents"}, false, "").Stats(); st.State != Off || st.Reason != "no extents" {
		t.Fatalf("cannot prewrite: %+v", st)
	}
	p = Start(&fakePool{}, false, "")
	p.Stop() // never started: nothing to stop
	if !p.Wait(0) {
		t.Fatal("a prewrite never started did not end")
	}
}
