package gpubench

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/tutti-io/tutti/devbench"
)

// ceiling is devbench's ceiling of each device, measured at the same time
// on all of them (each its own ring: devbench.CeilingEachInto), summed: the
// aggregate the striped storage delivers to raw large O_DIRECT reads. Each
// device's reads stay within the whole MiBs of the data it holds, and land
// in destBytes of memory per device (devbench.CeilingInto; 0: devbench's
// one block per read in flight, 32 MiB).
func (b *gpuBench) ceiling(destBytes int64) (float64, string) {
	rows, errs := devbench.CeilingEachInto(b.ctx, b.paths, b.ceilingSizes(), destBytes)
	var sum float64
	var notes []string
	small := 0
	for i, p := range b.paths {
		if errs[i] != nil {
			notes = append(notes, errs[i].Error())
			continue
		}
		sum += rows[i].BytesPerS
		notes = append(notes, fmt.Sprintf("%s %.2f", filepath.Base(p), rows[i].BytesPerS/1e9))
		if !rows[i].BufferHuge {
			small++
		}
	}
	if small > 0 {
		// 1 MiB reads into 4 KiB pages are split by many devices: a low
		// ceiling, which must not pass unnoticed.
		notes = append(notes, fmt.Sprintf("%d of %d destinations NOT on huge pages", small, len(b.paths)))
	}
	return sum, "(" + strings.Join(notes, ", ") + ")"
}

// stripedCeiling is devbench.CeilingStriped over the devices: each reads
// the bytes of the prefix it holds, into destBytes of memory, and the
// aggregate is timed to the slowest device. It returns bytes/s (0 when
// skipped or failed) and a note for the log.
func (b *gpuBench) stripedCeiling(destBytes int64, skip bool) (float64, string) {
	if skip {
		return 0, "(skipped)"
	}
	sizes := b.ceilingSizes()
	st, err := devbench.CeilingStriped(b.ctx, b.paths, sizes, sizes, destBytes)
	if err != nil {
		return 0, "FAILED: " + err.Error()
	}
	var notes []string
	for i, p := range b.paths {
		notes = append(notes, fmt.Sprintf("%s %.2f in %.0f ms", filepath.Base(p), st.Devices[i].BytesPerS/1e9, st.Devices[i].Seconds*1e3))
	}
	return st.BytesPerS, fmt.Sprintf("%.2f GB/s (each device its share of the prefix, timed to the slowest; %s; the devices' own rates sum to %.2f)",
		st.BytesPerS/1e9, strings.Join(notes, ", "), st.SumBytesPerS/1e9)
}

// ceilingSizes are the bytes the ceilings read on each device: the whole
// MiBs of the data written there (lay.devBytes).
func (b *gpuBench) ceilingSizes() []int64 {
	sizes := b.lay.devBytes()
	for i := range sizes {
		sizes[i] = sizes[i] / (1 << 20) * (1 << 20)
	}
	return sizes
}

// meanPositive is the mean of the positive ones of a and b (0 if neither).
func meanPositive(a, b float64) float64 {
	switch {
	case a > 0 && b > 0:
		return (a + b) / 2
	case a > 0:
		return a
	}
	return max(b, 0)
}

// bracketFraction is a rate's ceiling and its fraction of it from the
// ceiling sampled just before and just after it (the kernels-only paths
// and the store's operations alike): the mean of the samples
// (meanPositive), so that a drift of the host between them splits evenly,
// and bps over it; the fraction is 0 without a rate or a sample.
func bracketFraction(bps, before, after float64) (ceiling, fraction float64) {
	ceiling = meanPositive(before, after)
	if bps > 0 && ceiling > 0 {
		fraction = bps / ceiling
	}
	return ceiling, fraction
}

// ceilingDestBytes is each device's destination for the ceiling: its share
// of the staging pool the restore paths read into, in whole MiBs, 32 MiB to
// 1 GiB, so that the ceiling reads into memory as a restore does: devbench's
// own 32 MiB per device can fit in a large last-level cache, which makes
// that ceiling read high on RAM-backed devices (BENCHMARKS.md, What the
// defaults rest on); both are reported.
func (b *gpuBench) ceilingDestBytes() int64 {
	per := int64(b.r.Staging().Len()) / int64(len(b.paths)) / (1 << 20) * (1 << 20)
	return min(max(per, 32<<20), 1<<30)
}
