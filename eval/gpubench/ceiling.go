package gpubench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/tutti-io/tutti/devbench"
	"golang.org/x/sys/unix"
)

// Ceilings are the store directories' limits measured in the same run as the
// rows they divide: writes and then reads of one file per directory, every
// directory at once. RunStore samples them once before the stores (the
// scheduler's device profile) and then just before and just after every
// measured operation.
type Ceilings struct {
	// WriteBytesPS: devbench.CeilingStripedWrite over one file per
	// directory: all of each file overwritten with 1 MiB O_DIRECT
	// sequential writes at queue depth 32 and fdatasynced, every directory
	// at once, every byte over the slowest directory's time (a striped save
	// is durable when its slowest device's share is).
	WriteBytesPS float64 `json:"write_bytes_per_s"`
	// ReadBytesPS: devbench.CeilingStriped over the same files: all of each
	// file read with 1 MiB O_DIRECT random reads at queue depth 32, every
	// byte over the slowest directory's time.
	ReadBytesPS float64 `json:"read_bytes_per_s"`
	FileBytes   int64   `json:"file_bytes"` // per directory
	// WriteMemBytes and ReadMemBytes are the memory per directory the
	// first samples' writes came from and reads went into (devbench's
	// Row.BufferBytes).
	WriteMemBytes int64 `json:"write_mem_bytes,omitempty"`
	ReadMemBytes  int64 `json:"read_mem_bytes,omitempty"`
}

// ceilingFileName is the file measured in each directory, removed after.
const ceilingFileName = "tutti-gpubench-ceiling.dat"

// Limits of the ceiling files.
const (
	minCeilingFile = 64 << 20
	maxCeilingFile = 2 << 30
)

// storeCeilings are the ceiling files of a RunStore call, one per store
// directory, kept from its first sample to remove so that every sample
// overwrites and reads the same blocks, beside the store's pool; a nil
// *storeCeilings (NoCeiling) samples 0.
type storeCeilings struct {
	dirs, files []string
	fileBytes   int64
	memBytes    int64 // each ceiling's memory per directory: reads' destination, writes' source (0: devbench's default)
}

// maxCeilingMem bounds StoreConfig.CeilingMemBytes (every directory gets
// its own).
const maxCeilingMem = 1 << 30

// newStoreCeilings names a file of fileBytes in every directory, read into
// and written through memBytes each; create writes them.
func newStoreCeilings(dirs []string, fileBytes, memBytes int64) *storeCeilings {
	c := &storeCeilings{dirs: dirs, fileBytes: fileBytes, memBytes: memBytes}
	for _, d := range dirs {
		c.files = append(c.files, filepath.Join(d, ceilingFileName))
	}
	return c
}

// remove deletes the ceiling files.
func (c *storeCeilings) remove() {
	if c == nil {
		return
	}
	for _, f := range c.files {
		os.Remove(f)
	}
}

// sample is one sample of the write ceiling (write:
// devbench.CeilingStripedWrite, each file overwritten whole) or the read
// ceiling (devbench.CeilingStriped, each read whole): the same striped rule,
// as Ceilings says. The read needs the files written (create) first.
func (c *storeCeilings) sample(ctx context.Context, write bool) (ceilingSample, error) {
	if c == nil {
		return ceilingSample{}, nil
	}
	ceiling, what := devbench.CeilingStriped, "read"
	if write {
		ceiling, what = devbench.CeilingStripedWrite, "write"
	}
	sizes := slices.Repeat([]int64{c.fileBytes}, len(c.files))
	h0 := readHostCPU()
	st, err := ceiling(ctx, c.files, sizes, sizes, c.memBytes)
	if err != nil {
		return ceilingSample{}, fmt.Errorf("%s ceiling: %w", what, err)
	}
	cs := ceilingSample{BytesPS: st.BytesPerS, BusyCPUs: busyCPUs(h0, readHostCPU())}
	if len(st.Devices) > 0 {
		cs.MemBytes = st.Devices[0].BufferBytes
	}
	return cs, nil
}

// ceilingSample is one sample of a ceiling: its bytes/s and the host's CPUs
// busy while it ran (busyCPUs: the devices' own kernel work shows here).
type ceilingSample struct {
	BytesPS, BusyCPUs float64
	MemBytes          int64 // a directory's memory its I/Os moved through
}

// create writes every directory's ceiling file, all at once.
func (c *storeCeilings) create(ctx context.Context) error {
	errs := make([]error, len(c.files))
	var wg sync.WaitGroup
	for i, f := range c.files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := devbench.WriteCeilingFile(ctx, f, c.fileBytes); err != nil {
				errs[i] = fmt.Errorf("ceiling file in %s: %w", c.dirs[i], err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// storeSlackBytes is what ceilingFileBytes leaves free in each directory
// beyond the store's capacity: the file system's own blocks for the
// store's files.
const storeSlackBytes = 64 << 20

// ceilingFileBytes is the size of every directory's ceiling file: want (a
// directory's share of the prefix) clamped to 64 MiB..2 GiB in whole MiB,
// smaller where a file system, with storeBytes of store in each of its
// directories beside the files, has not the room (the files live as long
// as the stores do). Less than 64 MiB of room is an error.
func ceilingFileBytes(dirs []string, want, storeBytes int64) (int64, error) {
	size := min(max(want, minCeilingFile), maxCeilingFile)
	type fsRoom struct {
		dirs  int
		avail int64
		name  string
	}
	byFS := map[uint64]*fsRoom{}
	for _, d := range dirs {
		var st unix.Stat_t
		var fs unix.Statfs_t
		if err := unix.Stat(d, &st); err != nil {
			return 0, fmt.Errorf("store directory %s: %w", d, err)
		}
		if err := unix.Statfs(d, &fs); err != nil {
			return 0, fmt.Errorf("free space of %s: %w", d, err)
		}
		r := byFS[st.Dev]
		if r == nil {
			r = &fsRoom{avail: int64(fs.Bavail) * int64(fs.Bsize), name: d}
			byFS[st.Dev] = r
		}
		r.dirs++
	}
	for _, r := range byFS {
		room := (r.avail - int64(r.dirs)*(storeBytes+storeSlackBytes)) / int64(r.dirs)
		if room < minCeilingFile {
			return 0, fmt.Errorf("ceiling files: %d MiB free on the file system of %s, %d MiB per directory for its %d store(s) and 64 MiB per ceiling file needed (--no-ceiling skips the ceilings)",
				r.avail>>20, r.name, (storeBytes+storeSlackBytes)>>20, r.dirs)
		}
		size = min(size, room)
	}
	return size / (1 << 20) * (1 << 20), nil
}
