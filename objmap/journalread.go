package objmap

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

func segmentSeq(name string) (uint64, bool) {
	var seq uint64
	if _, err := fmt.Sscanf(name, "journal-%016x.log", &seq); err != nil || segmentName(seq) != name {
		return 0, false
	}
	return seq, true
}

// readCheckpoint loads dir/checkpoint; a missing file is an empty store.
func readCheckpoint(dir string) (runs []RunInfo, head Record, found bool, err error) {
	path := filepath.Join(dir, checkpointName)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, Record{}, false, nil
	}
	if err != nil {
		return nil, Record{}, false, fmt.Errorf("objmap: reading %s: %w", path, err)
	}
	// The checkpoint was fsynced before its rename, so any damage here is
	// real corruption, not a crash: fail closed.
	bad := func(at int, why string, args ...any) error {
		return fmt.Errorf("%w: %s at byte %d: %s", ErrCorruptStore, path, at, fmt.Sprintf(why, args...))
	}
	head, n, err := DecodeRecord(b)
	if err != nil {
		return nil, Record{}, false, bad(0, "%v", err)
	}
	if head.Type != RecCheckpoint {
		return nil, Record{}, false, bad(0, "first record is %s, want checkpoint", head.Type)
	}
	p := n
	for i := uint64(0); i < head.Count; i++ {
		r, n, err := DecodeRecord(b[p:])
		if err != nil {
			return nil, Record{}, false, bad(p, "run %d of %d: %v", i, head.Count, err)
		}
		if r.Type != RecCommit {
			return nil, Record{}, false, bad(p, "run %d of %d is a %s record", i, head.Count, r.Type)
		}
		runs = append(runs, r.Run)
		p += n
	}
	end, n, err := DecodeRecord(b[p:])
	if err != nil || end.Type != RecCheckpointEnd || end.Count != head.Count || p+n != len(b) {
		return nil, Record{}, false, bad(p, "missing or wrong end record (err %v, %d trailing bytes)", err, len(b)-p-n)
	}
	return runs, head, true, nil
}
