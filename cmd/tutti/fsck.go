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
	register("fsck", "check a store: manifest, journal, run headers and payload CRCs", runFsck)
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
	Error string `json:"error,omitempty"`
}

// runFsck opens the store read-only (it takes the directory locks, so it
// refuses a store that a runtime has open, and writes nothing), recovers it
// as Open would, then reads every served run in full and verifies each
// object's CRC32C. The geometry comes from the store's manifest. Exit status
// 1 when anything is corrupt or the metadata cannot be read.
func runFsck(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("fsck", stderr)
	var dirs dirList
	fs.Var(&dirs, "dir", "store directory (repeat for a store striped over several)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	buffered := fs.Bool("buffered", false, "open pool files without O_DIRECT (file systems that refuse it)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(dirs) == 0 || fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("need --dir D [--dir D2 ...] and no other arguments")
	}
	res := fsckResult{Dirs: dirs}
	m, err := objmap.Open(objmap.Options{Dirs: dirs, ReadOnly: true, Buffered: *buffered})
	if err != nil {
		if !errors.Is(err, objmap.ErrCorruptStore) {
			return err // not a store, locked, unreadable: say so, exit 1
		}
		// Metadata that cannot be trusted is corruption of the whole store.
		res.Corrupt = 1
		res.Error = err.Error()
		return printFsck(stdout, *asJSON, &res)
	}
	g := m.Geometry()
	res.Geometry = &g
	res.RecoveryReport, err = m.Check()
	if cerr := m.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return printFsck(stdout, *asJSON, &res)
}

func printFsck(w io.Writer, asJSON bool, res *fsckResult) error {
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
		if res.Error != "" {
			fmt.Fprintf(w, "corrupt: %s\n", res.Error)
		} else {
			fmt.Fprintln(w, res.RecoveryReport.String())
		}
	}
	if res.Corrupt > 0 {
		return exitError{code: 1}
	}
	return nil
}
