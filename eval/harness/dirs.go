package harness

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tutti-io/tutti/devbench"
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

// ceiling is the replay's device ceiling over its store roots.
type ceiling struct {
	// stripedBPS is what every backend's ceiling_fraction is over: the
	// roots as one striped array (devbench.CeilingStriped), since a restore
	// of blocks spread over them ends when its slowest root is done.
	stripedBPS float64
	// sumBPS is the sum of the roots' own ceilings measured at the same
	// time (devbench.CeilingEachInto), what ceiling_sum_fraction is over.
	sumBPS float64
	note   string
	// striped is the striped measurement; nil with one root, where the
	// striped ceiling and the sum are the one 2 s measurement (taken once).
	striped *devbench.StripedRow
}

// ceilingAcross measures devbench's ceiling over the roots, each reading a
// sizeBytes file ceiling.dat of its own (written once, before both
// measurements, and removed after them; a ceiling.dat left by an earlier
// run that died is replaced). First every root for 2 s at the same time
// (each its own ring): the sum. With more than one root, then the roots as one striped
// array: every root reads the same number of bytes, all starting
// together, and the aggregate is all bytes over the slowest root's time.
// Any root failing fails the whole: a partial figure would flatter every
// backend's ceiling fraction.
func ceilingAcross(ctx context.Context, roots []string, sizeBytes int64) (ceiling, error) {
	files := make([]string, len(roots))
	sizes := make([]int64, len(roots))
	for i, r := range roots {
		files[i] = filepath.Join(r, "ceiling.dat")
		sizes[i] = sizeBytes
	}
	defer func() {
		for _, f := range files {
			os.Remove(f)
		}
	}()
	for _, f := range files {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return ceiling{}, fmt.Errorf("removing a stale ceiling file: %w", err)
		}
		if err := devbench.WriteCeilingFile(ctx, f, sizeBytes); err != nil {
			return ceiling{}, fmt.Errorf("measuring the device ceiling of %s: %w", f, err)
		}
	}
	// 0: devbench's own 32 MiB of destination. Each root's row keeps its
	// bytes and time, which the striped read budget below comes from.
	rows, errs := devbench.CeilingEachInto(ctx, files, sizes, 0)
	var c ceiling
	least := int64(-1) // bytes the root that read least read in its 2 s
	each := make([]string, len(roots))
	for i, r := range roots {
		if errs[i] != nil {
			return ceiling{}, errs[i]
		}
		c.sumBPS += rows[i].BytesPerS
		if b := rows[i].Bytes; least < 0 || b < least {
			least = b
		}
		each[i] = fmt.Sprintf("%s %.2f", r, rows[i].BytesPerS/1e9)
	}
	if len(roots) == 1 {
		c.stripedBPS = c.sumBPS
		c.note = fmt.Sprintf("devbench: 1 MiB O_DIRECT random reads, QD 32, uring, 2 s, %d MiB file in %s (one dir: the striped ceiling and the sum are this one measurement)",
			sizeBytes>>20, roots[0])
		return c, nil
	}
	// The striped read budget: what the root that read least read in the
	// sum's 2 s, the same for every root (the backends spread their files
	// evenly). Its striped read then lasts about as long as the sum's
	// window, so the two figures differ by how evenly the roots keep up,
	// not by the length of the window: a budget of one pass over a 256 MiB
	// file lasts tens of ms on a fast device, where the ramp up to QD 32
	// and the drain of the last 32 reads (counted in a timed-to-the-last-
	// completion read, not in the sum's fixed window) are a large share.
	// It also bounds the measurement to about 2 s whatever the devices. At
	// least one 1 MiB read (CeilingStriped's minimum).
	budget := max(least, int64(1<<20))
	reads := slices.Repeat([]int64{budget}, len(roots))
	st, err := devbench.CeilingStriped(ctx, files, sizes, reads, 0)
	if err != nil {
		return ceiling{}, err
	}
	c.stripedBPS, c.striped = st.BytesPerS, &st
	striped := make([]string, len(roots))
	for i, r := range roots {
		striped[i] = fmt.Sprintf("%s %.2f in %.0f ms", r, st.Devices[i].BytesPerS/1e9, st.Devices[i].Seconds*1e3)
	}
	c.note = fmt.Sprintf("devbench, a file of %d MiB in each of %d dirs, 1 MiB O_DIRECT random reads, QD 32, uring, a ring per dir. "+
		"Striped (ceiling_fraction is over it): %.2f GB/s, every dir reading %d MiB at once (what the dir that read least read in the sum's 2 s), "+
		"all bytes over the slowest dir's %.0f ms, slowest %s; per dir GB/s: %s. "+
		"Sum (ceiling_sum_fraction is over it): %.2f GB/s, every dir reading for 2 s at once, their rates summed; per dir GB/s: %s",
		sizeBytes>>20, len(roots), st.BytesPerS/1e9, budget>>20, st.Seconds*1e3, roots[st.Slowest], strings.Join(striped, ", "),
		c.sumBPS/1e9, strings.Join(each, ", "))
	return c, nil
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
