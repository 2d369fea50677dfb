package harness

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/tutti-io/tutti/eval/devbench"
)

// Striping a replay over several store roots (Config.Dirs): every backend
// gets its own directory in each root and spreads its files over all of
// them, so every backend reads from the same aggregate devices. How each
// spreads: tutti through runtime.Config.Dirs (the object map stripes runs
// over files of every dir), per-block slot s in the file of dir s mod N,
// pagecache and cufile the file of chunk id in the dir spreadIndex picks.
// dram and recompute keep no files.

// roots returns the store roots: Dirs, or Dir alone.
func (c Config) roots() []string {
	if len(c.Dirs) > 0 {
		return c.Dirs
	}
	if c.Dir == "" {
		return nil
	}
	return []string{c.Dir}
}

// freeAcross is what the roots can hold when files are spread evenly over
// them: the smallest free space times the number of roots (0 if unknown),
// and where that was measured.
func freeAcross(roots []string) (int64, string) {
	least := int64(-1)
	for _, r := range roots {
		f := freeBytes(r)
		if f <= 0 {
			return 0, ""
		}
		if least < 0 || f < least {
			least = f
		}
	}
	if len(roots) == 1 {
		return least, roots[0]
	}
	return least * int64(len(roots)), fmt.Sprintf("%d dirs (%d × the %d MiB of the fullest)", len(roots), len(roots), least>>20)
}

// ceilingAcross measures devbench's ceiling in every root at the same time
// (each its own ring and sizeBytes file, as gpubench does on striped
// devices) and returns the sum: the aggregate the striped roots deliver to
// large O_DIRECT reads. Any root failing fails the whole: a partial sum
// would flatter every backend's ceiling fraction.
func ceilingAcross(ctx context.Context, roots []string, sizeBytes int64) (float64, string, error) {
	files := make([]string, len(roots))
	for i, r := range roots {
		files[i] = filepath.Join(r, "ceiling.dat")
	}
	vals, errs := devbench.CeilingEach(ctx, files, sizeBytes)
	var sum float64
	parts := make([]string, len(roots))
	for i, r := range roots {
		if errs[i] != nil {
			return 0, "", errs[i]
		}
		sum += vals[i]
		parts[i] = fmt.Sprintf("%s %.2f GB/s", r, vals[i]/1e9)
	}
	note := fmt.Sprintf("devbench: 1 MiB O_DIRECT random reads, QD 32, uring, 2 s, %d MiB file in %s", sizeBytes>>20, roots[0])
	if len(roots) > 1 {
		note = fmt.Sprintf("devbench: 1 MiB O_DIRECT random reads, QD 32, uring, 2 s, a %d MiB file in each of %d dirs measured at the same time, summed: %s",
			sizeBytes>>20, len(roots), strings.Join(parts, ", "))
	}
	return sum, note, nil
}

// spreadIndex picks which of n directories holds the file of chain block
// id: a mixed hash (splitmix64's finalizer), so ids that are consecutive or
// share low bits still spread evenly.
func spreadIndex(id uint64, n int) int {
	if n <= 1 {
		return 0
	}
	id ^= id >> 30
	id *= 0xbf58476d1ce4e5b9
	id ^= id >> 27
	id *= 0x94d049bb133111eb
	id ^= id >> 31
	return int(id % uint64(n))
}
