package gpubench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/tutti-io/tutti/devbench"
)

// Ceilings are the store directories' limits measured in the same run as the
// rows they divide: writes and then reads of one file per directory, every
// directory at once.
type Ceilings struct {
	// WriteBytesPS: devbench's O_DIRECT sequential 1 MiB writes at queue
	// depth 32 through uring for 2 s, each directory's own rate summed (the
	// directories' clocks start after each wrote its file once).
	WriteBytesPS float64 `json:"write_bytes_per_s"`
	// ReadBytesPS: devbench.CeilingStriped over the same files: all of each
	// file read with 1 MiB O_DIRECT random reads at queue depth 32, every
	// byte over the slowest directory's time.
	ReadBytesPS float64 `json:"read_bytes_per_s"`
	FileBytes   int64   `json:"file_bytes"` // per directory
}

// ceilingFileName is the file measured in each directory, removed after.
const ceilingFileName = "tutti-gpubench-ceiling.dat"

// Limits of the ceiling files.
const (
	minCeilingFile = 64 << 20
	maxCeilingFile = 2 << 30
)

// measureCeilings writes and reads one file of fileBytes (clamped to
// 64 MiB..2 GiB, whole MiB) in every directory and removes them.
func measureCeilings(ctx context.Context, dirs []string, fileBytes int64) (Ceilings, error) {
	fileBytes = min(max(fileBytes, minCeilingFile), maxCeilingFile) / (1 << 20) * (1 << 20)
	c := Ceilings{FileBytes: fileBytes}
	files := make([]string, len(dirs))
	for i, d := range dirs {
		files[i] = filepath.Join(d, ceilingFileName)
	}
	defer func() {
		for _, f := range files {
			os.Remove(f)
		}
	}()
	rates := make([]float64, len(dirs))
	errs := make([]error, len(dirs))
	var wg sync.WaitGroup
	for i := range dirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rows, err := devbench.Run(ctx, devbench.Config{Path: files[i], BlockSizes: []int{1 << 20}, QueueDepths: []int{32},
				Engines: []string{"uring"}, Ops: []string{"seqwrite"}, Runtime: 2 * time.Second, SizeBytes: fileBytes, Keep: true, Seed: uint64(i + 1)})
			if err == nil && len(rows) != 1 {
				err = fmt.Errorf("%d rows", len(rows))
			}
			if err != nil {
				errs[i] = fmt.Errorf("write ceiling of %s: %w", dirs[i], err)
				return
			}
			rates[i] = rows[0].BytesPerS
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	for _, r := range rates {
		c.WriteBytesPS += r
	}
	sizes := make([]int64, len(dirs))
	for i := range sizes {
		sizes[i] = fileBytes
	}
	st, err := devbench.CeilingStriped(ctx, files, sizes, sizes, 0)
	if err != nil {
		return c, fmt.Errorf("read ceiling: %w", err)
	}
	c.ReadBytesPS = st.BytesPerS
	return c, nil
}
