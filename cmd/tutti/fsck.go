package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/tutti-io/tutti/objmap"
)

func init() {
	register("fsck", "check a store (read-only): manifest, journal, run headers and payload CRCs; --repair fixes what it can", runFsck)
}

// dirList is a repeatable --dir flag.
type dirList []string

func (d *dirList) String() string     { return strings.Join(*d, ",") }
func (d *dirList) Set(v string) error { *d = append(*d, v); return nil }

// fsckResult is what --json prints: the recovery report with payloads
// checked (objects, recovered, dropped, corrupt and their reasons).
type fsckResult struct {
	Dirs     []string         `json:"dirs"`
	Geometry *objmap.Geometry `json:"geometry,omitempty"`
	objmap.RecoveryReport
	// Repaired: --repair opened the store for writing (a damaged journal
	// rewritten from the run headers, a torn tail truncated, dropped runs
	// freed) and freed the runs Check found corrupt (FreedCorrupt).
	Repaired     bool   `json:"repaired,omitempty"`
	FreedCorrupt int    `json:"freed_corrupt,omitempty"`
	Error        string `json:"error,omitempty"`
}

// runFsck checks a store. By default it opens it read-only: a shared lock
// on LOCK (it refuses a store a writer has open, naming its pid, and works
// on a read-only mount), nothing written; it recovers as Open would (from
// the run headers when the journal is damaged, in memory only), then reads
// every served run in full and verifies each chunk and object CRC32C.
// --repair opens it for writing instead (the exclusive lock), which makes
// recovery's repairs durable, and frees the runs whose payload is corrupt.
// Exit status 1 when anything is wrong (with --repair: was wrong; a second
// fsck then exits 0), or when the store cannot be opened at all.
func runFsck(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("fsck", stderr)
	var dirs dirList
	fs.Var(&dirs, "dir", "store directory (repeat for a store striped over several)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	buffered := fs.Bool("buffered", false, "open pool files without O_DIRECT (file systems that refuse it)")
	repair := fs.Bool("repair", false, "open the store for writing and repair it: rewrite a damaged journal from the run headers, truncate a torn tail, free dropped and corrupt runs")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if len(dirs) == 0 || fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("need --dir D [--dir D2 ...] and no other arguments")
	}
	res := fsckResult{Dirs: dirs, Repaired: *repair}
	m, err := objmap.Open(objmap.Options{Dirs: dirs, ReadOnly: !*repair, Buffered: *buffered})
	if err != nil {
		if !errors.Is(err, objmap.ErrCorruptStore) {
			return err // not a store, locked, unreadable: say so, exit 1
		}
		res.Error = err.Error()
		return printFsck(stdout, *asJSON, &res)
	}
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

// printFsck prints the verdict and returns exit status 1 unless the store
// is clean.
func printFsck(w io.Writer, asJSON bool, res *fsckResult) error {
	clean := res.Error == "" && res.Clean()
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
		switch {
		case res.Error != "":
			fmt.Fprintf(w, "corrupt: %s\n", res.Error)
		default:
			fmt.Fprintln(w, res.RecoveryReport.String())
		}
		switch {
		case clean:
			fmt.Fprintln(w, "clean")
		case res.Repaired:
			fmt.Fprintf(w, "problems found and repaired (%d corrupt runs freed); run fsck again to confirm\n", res.FreedCorrupt)
		case res.Error == "":
			fmt.Fprintln(w, "problems found; nothing was changed (fsck --repair, or the next writable open, repairs what it can)")
		}
	}
	if !clean {
		return exitError{code: 1}
	}
	return nil
}
