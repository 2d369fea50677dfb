package harness

import (
	"cmp"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// removeWorkers unlink a store's files in parallel: a file-per-block
// store holds tens of thousands of files, and on a file system mounted with
// online discard each unlink waits for its extents' discard, so one at a
// time a store can take longer to delete than its backend took to run.
const removeWorkers = 16

// removeQuietFor is how long a removal runs before it reports its progress
// (the quick ones, most of them, say nothing); a test shortens it.
var removeQuietFor = time.Second

// removeTree removes dir's contents, and dir itself unless keep names a
// file directly under it, which is then left (the directory's LOCK while
// its lock is held). Files go first, removeWorkers at a time; once the
// removal has run removeQuietFor, progress (nil: none) is called with the
// files removed and their total every 200 ms and at the end.
func removeTree(dir, keep string, progress func(done, total int)) error {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case !d.IsDir() && !(keep != "" && p == filepath.Join(dir, keep)):
			files = append(files, p)
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var done atomic.Int64
	stop := make(chan struct{})
	var reporter sync.WaitGroup
	if progress != nil && len(files) > 0 {
		reporter.Add(1)
		go func() {
			defer reporter.Done()
			quiet := time.NewTimer(removeQuietFor)
			defer quiet.Stop()
			select {
			case <-stop:
				return
			case <-quiet.C:
			}
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for {
				progress(int(done.Load()), len(files))
				select {
				case <-stop:
					progress(len(files), len(files))
					return
				case <-tick.C:
				}
			}
		}()
	}
	work := make(chan string)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for range min(removeWorkers, max(1, len(files))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range work {
				if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
					mu.Lock()
					first = cmp.Or(first, err)
					mu.Unlock()
				}
				done.Add(1)
			}
		}()
	}
	for _, p := range files {
		work <- p
	}
	close(work)
	wg.Wait()
	close(stop)
	reporter.Wait()
	if first != nil {
		return first
	}
	// The directories, empty now.
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if keep == "" {
		return os.RemoveAll(dir)
	}
	for _, e := range entries {
		if e.Name() != keep {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}
