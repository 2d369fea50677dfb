package devbench

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// StripedRow is what CeilingStriped or CeilingStripedWrite measured.
type StripedRow struct {
	BytesPerS float64 `json:"bytes_per_s"` // all devices' bytes over the slowest device's time
	Seconds   float64 `json:"seconds"`     // the slowest device's time
	Slowest   int     `json:"slowest"`     // its index
	Devices   []Row   `json:"devices"`     // each device's bytes over its own time
	// SumBytesPerS is the sum of the devices' own rates, what CeilingEachInto
	// would report for the same reads; BytesPerS / SumBytesPerS is how
	// evenly the devices kept up with each other.
	SumBytesPerS float64 `json:"sum_bytes_per_s"`
}

// stripedLimit bounds one striped ceiling device's I/O.
const stripedLimit = 120 * time.Second

// CeilingStriped is the ceiling of striped storage for one read of data
// spread over it: path i reads readBytes[i] (1 MiB O_DIRECT random reads
// within its first sizeBytes[i], queue depth 32, a ring each, rotating over
// bufferBytes of destination), all starting together once every device is
// set up, and the aggregate is every device's bytes over the time the
// slowest one took. A restore of striped data ends when its slowest device
// has delivered its share; the sum of the devices' rates over a fixed time
// (CeilingEachInto) counts the faster devices' extra reads, which such a
// read cannot use. A device that does not finish within 120 s, or fails, is
// an error (the rows of the others are still returned).
func CeilingStriped(ctx context.Context, paths []string, sizeBytes, readBytes []int64, bufferBytes int64) (StripedRow, error) {
	return striped(ctx, ceilingSpec, paths, sizeBytes, readBytes, bufferBytes)
}

// CeilingStripedWrite is CeilingStriped for one write of data spread over
// striped storage, by the same rule: path i gets writeBytes[i] of 1 MiB
// O_DIRECT sequential writes (queue depth 32, wrapping within its first
// sizeBytes[i]) and then an fdatasync, all starting together, and the
// aggregate is every device's bytes over the slowest one's time to its
// sync. A striped save is durable when its slowest device's share is. The
// paths' first sizeBytes[i] must be written (a file devbench or
// WriteCeilingFile wrote, or a device: its blocks are overwritten), so that
// the writes overwrite allocated blocks; a path that does not exist gets a
// test file, removed afterwards.
func CeilingStripedWrite(ctx context.Context, paths []string, sizeBytes, writeBytes []int64, bufferBytes int64) (StripedRow, error) {
	return striped(ctx, ceilingWriteSpec, paths, sizeBytes, writeBytes, bufferBytes)
}

// striped runs spec on every path at once, path i moving budget[i] bytes.
func striped(ctx context.Context, spec Spec, paths []string, sizeBytes, budget []int64, bufferBytes int64) (StripedRow, error) {
	if len(sizeBytes) != len(paths) || len(budget) != len(paths) {
		return StripedRow{}, fmt.Errorf("striped ceiling: %d paths, %d sizes, %d budgets", len(paths), len(sizeBytes), len(budget))
	}
	write := isWrite(spec.Op)
	what := "read"
	if write {
		what = "write"
	}
	rows, errs := together(len(paths), func(i int, ready func()) (Row, error) {
		if budget[i] < int64(spec.BlockBytes) {
			return Row{}, fmt.Errorf("striped %s ceiling of %s: %d bytes to %s, less than one 1 MiB %s", what, paths[i], budget[i], what, what)
		}
		o := uringRun{bufferBytes: bufferBytes, budgetBytes: budget[i], ready: ready, syncAtEnd: write}
		row, err := ceilingOn(ctx, paths[i], sizeBytes[i], stripedLimit, spec, o)
		if got := row.Bytes; err == nil && got < budget[i] {
			err = fmt.Errorf("%s %d of %d bytes in %v", what, got, budget[i], stripedLimit)
		}
		if err != nil {
			return row, fmt.Errorf("striped %s ceiling of %s: %w", what, paths[i], err)
		}
		return row, nil
	})
	out := StripedRow{Devices: rows}
	var total float64
	for i, r := range rows {
		if errs[i] != nil {
			return out, errs[i]
		}
		total += float64(r.Bytes)
		out.SumBytesPerS += r.BytesPerS
		if r.Seconds > out.Seconds {
			out.Seconds, out.Slowest = r.Seconds, i
		}
	}
	if out.Seconds > 0 {
		out.BytesPerS = total / out.Seconds
	}
	return out, nil
}

// together runs f(i, ready) for i in [0, n) at once, each on its own
// goroutine. ready is a barrier: it returns when every f has called it or
// returned, so their measurements start together; an f that fails before
// it releases the others.
func together(n int, f func(i int, ready func()) (Row, error)) ([]Row, []error) {
	rows, errs := make([]Row, n), make([]error, n)
	var arrived, done sync.WaitGroup
	arrived.Add(n)
	for i := 0; i < n; i++ {
		done.Add(1)
		go func() {
			defer done.Done()
			var once sync.Once
			arrive := func() { once.Do(arrived.Done) }
			defer arrive()
			rows[i], errs[i] = f(i, func() { arrive(); arrived.Wait() })
		}()
	}
	done.Wait()
	return rows, errs
}
