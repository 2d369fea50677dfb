package gpubench

import (
	"context"
	"fmt"
	"io"
	"slices"

	evalmodel "github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/kvshape"
)

// Store rounds. The product rows run in rounds as the kernels-only rows do
// (rounds.go): every round runs every path's operations (save, restore,
// restore-warm, save-again) in roundOrder's order of the paths, each
// operation between two samples of its ceiling (write for a save, read for
// a restore), and the rows are the medians over the rounds with the
// per-round values kept.

// RunStore measures every path of cfg in cfg.Rounds rounds and returns one
// row per path and operation, in cfg.Paths' order: the median over the
// rounds (mergeStoreRounds). Each round gives each path a fresh store over
// cfg.Dirs (one store at a time), the prefix filled, saved (timed to Done,
// the commit), restored into poisoned memory (timed to Wait) and verified.
// The ceilings are measured once before the rounds (the scheduler's device
// profile, returned) and sampled around every operation. A cancelled ctx
// stops it before the next path; on any error the rows are those of the
// rounds that finished.
func RunStore(ctx context.Context, cfg StoreConfig, log io.Writer) ([]StoreRow, Ceilings, error) {
	prof, err := evalmodel.Lookup(cfg.Model)
	if err != nil {
		return nil, Ceilings{}, err
	}
	g, err := prof.Geometry()
	if err != nil {
		return nil, Ceilings{}, err
	}
	if cfg.Tokens < 1 || cfg.Tokens > maxTokens || len(cfg.Dirs) == 0 || len(cfg.Paths) == 0 {
		return nil, Ceilings{}, fmt.Errorf("store bench: tokens %d (1..%d), %d dirs, %d paths: need all", cfg.Tokens, maxTokens, len(cfg.Dirs), len(cfg.Paths))
	}
	for _, p := range cfg.Paths {
		if !IsStorePath(p) {
			return nil, Ceilings{}, fmt.Errorf("store bench: unknown path %q (want %s or %s)", p, PathStoreGPU, PathStoreCPU)
		}
	}
	if cfg.Rounds == 0 {
		cfg.Rounds = 1
	}
	if cfg.Rounds < 1 || cfg.Rounds > MaxRounds {
		return nil, Ceilings{}, fmt.Errorf("store bench: %d rounds: want 1..%d", cfg.Rounds, MaxRounds)
	}
	tokensPerBlock := g.PageTokens * g.ChunkPages
	blocks := (cfg.Tokens + tokensPerBlock - 1) / tokensPerBlock
	var ceil Ceilings
	var c *storeCeilings
	if !cfg.NoCeiling {
		if cfg.CeilingMemBytes < 0 || cfg.CeilingMemBytes > maxCeilingMem {
			return nil, Ceilings{}, fmt.Errorf("store bench: ceiling memory %d bytes per directory: want 0..%d", cfg.CeilingMemBytes, maxCeilingMem)
		}
		if c, ceil, err = openStoreCeilings(ctx, cfg.Dirs, g, blocks, cfg.CeilingMemBytes); err != nil {
			return nil, ceil, err
		}
		defer c.remove()
		fmt.Fprintf(log, "ceilings over %d dirs (%d MiB per dir, written from %d MiB and read into %d MiB per dir): write %.2f GB/s, read %.2f GB/s\n",
			len(cfg.Dirs), ceil.FileBytes>>20, ceil.WriteMemBytes>>20, ceil.ReadMemBytes>>20, ceil.WriteBytesPS/1e9, ceil.ReadBytesPS/1e9)
	}
	var rounds [][]StoreRow
	for k := 0; k < cfg.Rounds; k++ {
		rows, err := runStoreRound(ctx, cfg, k, g, blocks, ceil, c, log)
		if err != nil {
			merged, _ := mergeStoreRounds(rounds)
			return merged, ceil, err
		}
		rounds = append(rounds, rows)
	}
	merged, err := mergeStoreRounds(rounds)
	return merged, ceil, err
}

// openStoreCeilings sizes the ceiling files (ceilingFileBytes: a
// directory's share of the prefix, where it fits beside the store), writes
// them and takes the first sample of both ceilings; the caller removes the
// files.
func openStoreCeilings(ctx context.Context, dirs []string, g kvshape.Geometry, blocks int, memBytes int64) (*storeCeilings, Ceilings, error) {
	payload := int64(blocks) * g.ChunkBytes()
	n := int64(len(dirs))
	size, err := ceilingFileBytes(dirs, payload/n, (storeCapacity(g, blocks, len(dirs))+n-1)/n)
	if err != nil {
		return nil, Ceilings{}, err
	}
	c := newStoreCeilings(dirs, size, memBytes)
	ceil := Ceilings{FileBytes: size}
	var w, r ceilingSample
	if err = c.create(ctx); err == nil {
		w, err = c.sample(ctx, true)
	}
	if err == nil {
		r, err = c.sample(ctx, false)
	}
	ceil.WriteBytesPS, ceil.ReadBytesPS = w.BytesPS, r.BytesPS
	ceil.WriteMemBytes, ceil.ReadMemBytes = w.MemBytes, r.MemBytes
	if err != nil {
		c.remove()
		return nil, ceil, err
	}
	return c, ceil, nil
}

// runStoreRound is round k: every path in roundOrder's order, its rows
// logged as they come. It returns the rows in cfg.Paths' order.
func runStoreRound(ctx context.Context, cfg StoreConfig, k int, g kvshape.Geometry, blocks int, ceil Ceilings, c *storeCeilings, log io.Writer) ([]StoreRow, error) {
	byPath := make([][]StoreRow, len(cfg.Paths))
	for j, i := range roundOrder(len(cfg.Paths), k) {
		if err := ctx.Err(); err != nil {
			return nil, err // cancelled: no further path starts
		}
		p := cfg.Paths[i]
		rs, err := runStorePath(ctx, cfg, p, g, blocks, ceil, c)
		for r := range rs {
			rs[r].Model, rs[r].Storage, rs[r].Dirs, rs[r].Tokens = cfg.Model, cfg.Label, len(cfg.Dirs), cfg.Tokens
			rs[r].position = j
			fmt.Fprintf(log, "  round %d/%d %-9s %-12s %s\n", k+1, cfg.Rounds, p, rs[r].Op, Summary(rs[r]))
		}
		if err != nil {
			if cfg.Rounds > 1 {
				return nil, fmt.Errorf("round %d of %d: %s: %w", k+1, cfg.Rounds, p, err)
			}
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		byPath[i] = rs
		if cfg.Progress != nil {
			cfg.Progress("gpubench store paths", k*len(cfg.Paths)+j+1, cfg.Rounds*len(cfg.Paths))
		}
	}
	return slices.Concat(byPath...), nil
}

// mergeStoreRounds folds rounds (rounds[k][i]: row i of round k; every
// round has the same path and op at each i) into one row each: the round
// with the median bytes/s (medianIndex's rule, as mergeRounds), with the
// medians of the ceiling, the fraction and the CPU s/GiB put in, the
// mismatches summed over all rounds, and the per-round values in PerRound.
func mergeStoreRounds(rounds [][]StoreRow) ([]StoreRow, error) {
	if len(rounds) == 0 {
		return nil, nil
	}
	n := len(rounds[0])
	out := make([]StoreRow, n)
	for i := range out {
		var st RoundStats
		var mism uint64
		for k, r := range rounds {
			if len(r) != n {
				return nil, fmt.Errorf("round %d has %d store rows, round 1 has %d", k+1, len(r), n)
			}
			row := r[i]
			if row.Path != rounds[0][i].Path || row.Op != rounds[0][i].Op {
				return nil, fmt.Errorf("round %d row %d is %s %s, round 1 has %s %s there", k+1, i+1, row.Path, row.Op, rounds[0][i].Path, rounds[0][i].Op)
			}
			mism += row.Mismatches
			st.BytesPerS = append(st.BytesPerS, row.BytesPerS)
			st.CeilingBytesPS = append(st.CeilingBytesPS, row.CeilingBytesPS)
			st.CeilingFraction = append(st.CeilingFraction, row.CeilingFraction)
			st.CPUSPerGiB = append(st.CPUSPerGiB, row.CPUSPerGiB)
			st.Position = append(st.Position, row.position)
		}
		row := rounds[medianIndex(st.BytesPerS)][i]
		row.CeilingBytesPS = Median(st.CeilingBytesPS)
		row.CeilingFraction = Median(st.CeilingFraction)
		row.CPUSPerGiB = Median(st.CPUSPerGiB)
		row.Mismatches = mism
		row.Rounds = len(rounds)
		row.PerRound = st
		out[i] = row
	}
	return out, nil
}

// storeRatio is one op's store-gpu bytes/s over store-cpu's in each round
// (the first row of each path with that op).
type storeRatio struct {
	Op     string
	Rounds []float64
}

// storeRatios are the ratios of the ops that both store paths ran, in
// rows' order; a round where store-cpu moved nothing is left out.
func storeRatios(rows []StoreRow) []storeRatio {
	var out []storeRatio
	for _, g := range rows {
		if g.Path != PathStoreGPU || slices.ContainsFunc(out, func(r storeRatio) bool { return r.Op == g.Op }) {
			continue
		}
		i := slices.IndexFunc(rows, func(r StoreRow) bool { return r.Path == PathStoreCPU && r.Op == g.Op })
		if i < 0 {
			continue
		}
		cpu := rows[i].PerRound.BytesPerS
		r := storeRatio{Op: g.Op}
		for k, v := range g.PerRound.BytesPerS {
			if k < len(cpu) && cpu[k] > 0 {
				r.Rounds = append(r.Rounds, v/cpu[k])
			}
		}
		if len(r.Rounds) > 0 {
			out = append(out, r)
		}
	}
	return out
}

// printStoreTable prints the merged rows, a row's fraction with its range
// over the rounds, then each op's store-gpu/store-cpu ratio line.
func printStoreTable(w io.Writer, rows []StoreRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "median of %d rounds (x ceil: the operation's bytes/s over the mean of its ceiling, write for a save, read for a restore, sampled just before and just after it; [min-max] over the rounds):\n", rows[0].Rounds)
	fmt.Fprintf(w, "  %-9s %-12s %6s %9s %8s %15s %10s %9s %s\n", "path", "op", "blocks", "GB/s", "x ceil", "[min-max]", "CPU s/GiB", "mismatch", "host CPUs busy")
	for _, r := range rows {
		f := r.PerRound.CeilingFraction
		span := ""
		if len(f) > 0 {
			span = fmt.Sprintf("[%.3f-%.3f]", slices.Min(f), slices.Max(f))
		}
		fmt.Fprintf(w, "  %-9s %-12s %6d %9.2f %8.3f %15s %10.4f %9d %s\n", r.Path, r.Op, r.Blocks, r.BytesPerS/1e9, r.CeilingFraction, span, r.CPUSPerGiB, r.Mismatches, r.busy())
	}
	for _, q := range storeRatios(rows) {
		fmt.Fprintf(w, "  %s/%s %-12s median %.3f [%.3f-%.3f] of %d rounds (bytes/s, round by round)\n",
			PathStoreGPU, PathStoreCPU, q.Op, Median(q.Rounds), slices.Min(q.Rounds), slices.Max(q.Rounds), len(q.Rounds))
	}
}
