package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
)

func init() {
	register("fsck", "check a store (read-only): manifest, journal, run headers and payload CRCs; --repair fixes what it can", runFsck)
}

// fsckResult is what --json prints: the recovery report with payloads
// checked (objects, recovered, dropped, corrupt and their reasons).
type fsckResult struct {
	Dirs     []string          `json:"dirs"`
	Geometry *kvshape.Geometry `json:"geometry,omitempty"`
	objmap.RecoveryReport
	// Repaired: --repair opened the store for writing (a damaged journal
	// rewritten from the run headers, a torn tail truncated, dropped runs
	// freed) and freed the runs Check found corrupt (FreedCorrupt).
	Repaired     bool   `json:"repaired,omitempty"`
	FreedCorrupt int    `json:"freed_corrupt,omitempty"`
	Error        string `json:"error,omitempty"`
	// StoresBelow: with no store in the one directory given, its
	// subdirectories that hold one (a hybrid model's KV cache groups,
	// python/tutti/groups.py: a store per group), to check one by one.
	StoresBelow []string `json:"stores_below,omitempty"`
	// Verdict is one of the fsckVerdict* values.
	Verdict string `json:"verdict"`
}

// fsck's verdicts and their exit statuses: the store is clean (0), had
// problems (1: found, or found and repaired), its metadata is corrupt (1),
// the directories hold no store (2), or a directory of the store is missing
// (3). Only the first three checked a store.
const (
	fsckClean       = "clean"
	fsckProblems    = "problems"
	fsckCorrupt     = "corrupt"
	fsckNoStore     = "no store"
	fsckMissing     = "missing directory"
	fsckExitNoStore = 2
	fsckExitMissing = 3
)

// runFsck checks a store. By default it opens it read-only: a shared lock
// on LOCK (it refuses a store a writer has open, naming its pid, and works
// on a read-only mount), nothing written; it recovers as Open would (from
// the run headers when the journal is damaged, in memory only), then reads
// every served run in full and verifies each chunk and object CRC32C.
// --repair opens it for writing instead (the exclusive lock), which makes
// recovery's repairs durable, and frees the runs whose payload is corrupt.
// Neither mode creates anything: a directory that does not exist is named
// as missing, and directories without a store are not a store (no repair
// makes one). Exit status 1 when anything is wrong (with --repair: was
// wrong; a second fsck then exits 0) or the store cannot be opened (locked,
// unreadable); 2 and 3 as fsckExitNoStore and fsckExitMissing say.
func runFsck(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("fsck", stderr)
	var dirs dirsFlag
	fs.Var(&dirs, "dir", "store directory, or several comma-separated or repeated (a store striped over several)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	buffered := fs.Bool("buffered", false, "open pool files without O_DIRECT (file systems that refuse it)")
	repair := fs.Bool("repair", false, "open the store for writing and repair it: rewrite a damaged journal from the run headers, truncate a torn tail, free dropped and corrupt runs")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if len(dirs.dirs) == 0 || fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("need --dir D[,D2...] (or --dir repeated) and no other arguments")
	}
	res := fsckResult{Dirs: dirs.dirs}
	m, err := objmap.Open(objmap.Options{Dirs: dirs.dirs, ReadOnly: !*repair, MustExist: true, Buffered: *buffered})
	if err != nil {
		switch {
		case errors.Is(err, objmap.ErrMissingDir):
			res.Verdict = fsckMissing
		case errors.Is(err, objmap.ErrNoStore):
			res.Verdict = fsckNoStore
		case errors.Is(err, objmap.ErrCorruptStore):
			res.Verdict = fsckCorrupt
		default:
			return err // locked, unreadable: say so, exit 1
		}
		res.Error = err.Error()
		if res.Verdict == fsckNoStore && len(dirs.dirs) == 1 {
			res.StoresBelow = storesBelow(dirs.dirs[0], *buffered)
		}
		return printFsck(stdout, *asJSON, &res)
	}
	res.Repaired = *repair
	g := m.Geometry()
	res.Geometry = &g
	res.RecoveryReport, err = m.Check()
	if err == nil && *repair {
		for _, p := range res.CorruptRuns {
			if ferr := m.Free(p.Run); ferr != nil {
				err = fmt.Errorf("freeing corrupt run %d: %w", p.Run, ferr)
				break
			}
			res.FreedCorrupt++
		}
	}
	if cerr := m.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return printFsck(stdout, *asJSON, &res)
}

// maxStoresBelow bounds the subdirectories storesBelow opens.
const maxStoresBelow = 64

// storesBelow lists dir's subdirectories that hold a store, as read-only
// opens find them (nothing is created or written): a store another process
// holds, or a corrupt one, is a store too. At most maxStoresBelow are
// tried, in name order.
func storesBelow(dir string, buffered bool) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	tried := 0
	for _, e := range ents {
		if !e.IsDir() || tried >= maxStoresBelow {
			continue
		}
		tried++
		sub := filepath.Join(dir, e.Name())
		m, err := objmap.Open(objmap.Options{Dirs: []string{sub}, ReadOnly: true, MustExist: true, Buffered: buffered})
		switch {
		case err == nil:
			_ = m.Close() // read-only: nothing to flush
		case errors.Is(err, objmap.ErrNoStore), errors.Is(err, objmap.ErrMissingDir):
			continue
		}
		out = append(out, sub)
	}
	return out
}

// printFsck prints the verdict and returns its exit status unless the
// store is clean. A store that could not be opened was not repaired,
// whatever --repair asked.
func printFsck(w io.Writer, asJSON bool, res *fsckResult) error {
	clean := res.Error == "" && res.Clean()
	switch {
	case res.Verdict != "":
	case clean:
		res.Verdict = fsckClean
	default:
		res.Verdict = fsckProblems
	}
	if asJSON {
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "%s\n", b)
	} else {
		fmt.Fprintf(w, "store %s\n", strings.Join(res.Dirs, ", "))
		if res.Geometry != nil {
			fmt.Fprintf(w, "geometry %v\n", *res.Geometry)
		}
		switch res.Verdict {
		case fsckClean:
			fmt.Fprintln(w, res.RecoveryReport.String())
			fmt.Fprintln(w, "clean")
		case fsckProblems:
			fmt.Fprintln(w, res.RecoveryReport.String())
			if res.Repaired {
				fmt.Fprintf(w, "problems found and repaired (%d corrupt runs freed); run fsck again to confirm\n", res.FreedCorrupt)
			} else {
				fmt.Fprintln(w, "problems found; nothing was changed (fsck --repair, or the next writable open, repairs what it can)")
			}
		case fsckCorrupt:
			fmt.Fprintf(w, "corrupt: %s\nnothing was changed\n", res.Error)
		case fsckNoStore:
			fmt.Fprintf(w, "no store here: %s\nnothing was changed (fsck never creates a store)\n", res.Error)
			if len(res.StoresBelow) > 0 {
				fmt.Fprintf(w, "stores below it (a hybrid model's KV cache groups hold one each); check each: fsck --dir %s\n",
					strings.Join(res.StoresBelow, ", fsck --dir "))
			}
		case fsckMissing:
			fmt.Fprintf(w, "missing: %s\nnothing was changed (fsck checks and repairs only a store whose directories are all there)\n", res.Error)
		}
	}
	switch res.Verdict {
	case fsckClean:
		return nil
	case fsckNoStore:
		return exitError{code: fsckExitNoStore}
	case fsckMissing:
		return exitError{code: fsckExitMissing}
	}
	return exitError{code: 1}
}
