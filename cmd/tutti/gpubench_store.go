package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/tutti-io/tutti/eval/gpubench"
)

// storeFlags are what the product-path rows (eval/gpubench.RunStore) take
// from gpubench's flags.
type storeFlags struct {
	model, label, dirs, jsonPath string
	tokens                       int
	seed                         uint64
	noCeiling, appendJSON        bool
}

// splitStorePaths separates the product paths (store-gpu, store-cpu) from
// the kernels-only ones, keeping each list's order.
func splitStorePaths(list string) (kernelPaths, storePaths []string) {
	for _, p := range strings.Split(list, ",") {
		switch p = strings.TrimSpace(p); {
		case p == "":
		case gpubench.IsStorePath(p):
			storePaths = append(storePaths, p)
		default:
			kernelPaths = append(kernelPaths, p)
		}
	}
	return kernelPaths, storePaths
}

// runStoreRows measures the product paths and prints their table; with
// --json its rows go to the same file (appended after the kernels-only rows
// when those ran).
func runStoreRows(f storeFlags, paths []string, stdout, stderr io.Writer) error {
	if f.dirs == "" {
		return fmt.Errorf("--paths %s: need --store-dirs or --dir (directories on the devices' filesystems)", strings.Join(paths, ","))
	}
	cfg := gpubench.StoreConfig{Model: f.model, Tokens: f.tokens, Dirs: strings.Split(f.dirs, ","), Label: f.label,
		Seed: f.seed, Paths: paths, NoCeiling: f.noCeiling}
	fmt.Fprintf(stdout, "gpubench product paths %v: %s, %d tokens, storage %q on %v (runtime.Store Save timed to the commit, Load timed to Wait, every byte verified)\n",
		paths, f.model, f.tokens, f.label, cfg.Dirs)
	rows, _, err := gpubench.RunStore(context.Background(), cfg, stderr)
	for _, r := range rows {
		fmt.Fprintf(stdout, "  %-9s %-7s %s\n", r.Path, r.Op, gpubench.Summary(r))
	}
	if werr := writeJSONRows(f.jsonPath, stdout, rows, f.appendJSON); werr != nil && err == nil {
		err = werr
	}
	if err != nil {
		return err
	}
	for _, r := range rows {
		if r.Mismatches != 0 {
			return fmt.Errorf("path %s %s: %d mismatched words", r.Path, r.Op, r.Mismatches)
		}
	}
	return nil
}
