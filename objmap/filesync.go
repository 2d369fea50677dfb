package objmap

import (
	"sync"

	"golang.org/x/sys/unix"
)

// fileSyncer shares fdatasync of one pool file between concurrent commits:
// a caller needs a sync that started after its own writes completed; if one
// is running, it waits for the next, which covers every caller that arrived
// meanwhile (the same group commit as the journal's, for pool files).
type fileSyncer struct {
	fd      int
	mu      sync.Mutex
	cond    sync.Cond
	started uint64
	done    uint64
	running bool
	err     error // of the last sync; sticky, like the journal's
	syncs   int64
}

func newFileSyncer(fd int) *fileSyncer {
	s := &fileSyncer{fd: fd}
	s.cond.L = &s.mu
	return s
}

// sync returns once an fdatasync that started after the call began has
// completed (nil) or failed.
func (s *fileSyncer) sync() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	target := s.started + 1
	for s.done < target {
		if s.err != nil {
			return s.err
		}
		if s.running {
			s.cond.Wait()
			continue
		}
		s.running = true
		s.started++
		n := s.started
		s.mu.Unlock()
		err := unix.Fdatasync(s.fd)
		s.mu.Lock()
		s.running = false
		s.syncs++
		if err != nil {
			// After a failed fdatasync the page cache state is unknown
			// (the kernel may have dropped the dirty pages): fail closed.
			s.err = err
		} else {
			s.done = n
		}
		s.cond.Broadcast()
	}
	return nil
}
