package gpubench

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/objmap"
)

// runKernelPaths measures the kernels-only paths: cfg.Rounds rounds over
// one set of data files, their median rows printed and written to --json.
// With --dir it holds that directory's objmap lock throughout, so that a
// second gpubench on the same directory fails (naming this one's pid)
// before it truncates or removes a data file or its .layout sidecar.
func runKernelPaths(ctx context.Context, cfg Config, paths []string, stdout, stderr io.Writer) error {
	b, err := newGPUBench(ctx, cfg, stderr)
	if err != nil {
		return err
	}
	kl := kernels.LayoutPerLayer
	if cfg.Layout == "cross-layer" {
		kl = kernels.LayoutCrossLayer
	}
	if cfg.Devices == "" {
		lock, err := objmap.LockDir(cfg.Dir)
		if err != nil {
			return fmt.Errorf("gpubench --dir: %w", err)
		}
		defer lock.Unlock()
	}
	name, sms, err := kernels.DeviceName(0)
	if err != nil {
		return fmt.Errorf("gpubench needs the GPU and the kernels library: %w", err)
	}
	fmt.Fprintf(stdout, "gpubench %s: %d layers x %d pages of %d KiB (%s), %.2f GiB, %s, storage %q on %v: %s, GPU %s (%d SMs), content internal/kvdata blocks %d..\n",
		cfg.Model, b.g.Layers, b.pages, b.g.PageBytesPerLayer()>>10, kl, float64(b.totalBytes())/(1<<30), time.Now().UTC().Format(time.RFC3339), b.label, b.paths, b.lay, name, sms, cfg.Seed)

	err = b.writeData(cfg.Reuse)
	defer b.closeFiles()
	if err != nil {
		return err
	}
	kv, freeKV, err := b.allocKV(kl)
	defer freeKV()
	if err != nil {
		return err
	}
	b.sizeReads(&cfg)
	closeAll, err := b.bind(cfg, kl, kv)
	defer closeAll()
	if err != nil {
		return err
	}
	var rounds [][]Row
	for k := 0; k < cfg.Rounds; k++ {
		rows, err := b.runRound(cfg, paths, k, stdout)
		if err != nil {
			return err
		}
		rounds = append(rounds, rows)
	}
	rows, err := mergeRounds(rounds)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "median of %d rounds (x ceil: the median of each restore's bytes/s over the striped ceiling sampled around it; x sum: over its round's sum of the devices' ceilings):\n", cfg.Rounds)
	printTable(stdout, rows)
	if err := writeJSONLines(cfg.JSONPath, stdout, rows); err != nil {
		return err
	}
	for _, r := range rows {
		if r.Mismatches != 0 {
			return fmt.Errorf("path %s: %d mismatched words", r.Path, r.Mismatches)
		}
	}
	return nil
}

// runRound is round k of cfg.Rounds: a fresh sum ceiling, then every path
// in roundOrder's order, each bracketed by striped ceiling samples. It
// returns the rows in paths' order, or ctx's error when cancelled.
func (b *gpuBench) runRound(cfg Config, paths []string, k int, stdout io.Writer) ([]Row, error) {
	dest := b.ceilingDestBytes()
	sum, cnote, cached, cachedNote := 0.0, "(skipped)", 0.0, "(skipped)"
	if !cfg.NoCeiling {
		cached, cachedNote = b.ceiling(0)
		sum, cnote = b.ceiling(dest)
	}
	fmt.Fprintf(stdout, "round %d of %d: sum of the devices' ceilings (devbench.CeilingEachInto: 1 MiB O_DIRECT random reads, QD 32, uring, 2 s, all devices at once, into %d MiB per device, the staging pool's share): %.2f GB/s %s; into devbench's 32 MiB per device (cache-resident): %.2f GB/s %s\n",
		k+1, cfg.Rounds, dest>>20, sum/1e9, cnote, cached/1e9, cachedNote)
	// The paths run in roundOrder's order, so that no path always runs
	// first or right after another; each is bracketed by striped ceiling
	// samples, and its fraction is taken against their mean
	// (bracketFraction).
	rows := make([]Row, len(paths))
	before, bnote := b.stripedCeiling(dest, cfg.NoCeiling)
	b.logf("  striped ceiling %s\n", bnote)
	for j, i := range roundOrder(len(paths), k) {
		if err := b.ctx.Err(); err != nil {
			return nil, err
		}
		row := b.runPath(strings.TrimSpace(paths[i]))
		row.position = j
		after, anote := b.stripedCeiling(dest, cfg.NoCeiling)
		row.Storage, row.Model = b.label, b.model
		row.CeilingBytesPS, row.CeilingFraction = bracketFraction(row.BytesPerS, before, after)
		row.CeilingSumBytesPS, row.CeilingCachedBytesPS = sum, cached
		row.Stripe, row.RunPages = b.lay.stripe, b.lay.jsonRunPages()
		if row.BytesPerS > 0 && sum > 0 {
			row.CeilingSumFraction = row.BytesPerS / sum
		}
		rows[i] = row
		b.logf("  %-26s %s\n", row.Path, rowSummary(row))
		b.logf("  striped ceiling %s\n", anote)
		b.tell("gpubench paths", k*len(paths)+j+1, cfg.Rounds*len(paths))
		before = after
	}
	return rows, nil
}
