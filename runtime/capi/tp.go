package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime/tp"
)

// rankFile is the marker each store directory carries: which tensor-parallel
// rank of which degree stored into it. Two ranks' shards of the same model
// have the same geometry, so without it rank 1 opening rank 0's directories
// would restore rank 0's heads, silently.
const rankFile = "tutti-tp-rank"

// checkTP checks tp_rank and tp_size (0 and 1 both mean no tensor parallelism).
func (c config) checkTP() error {
	size := max(c.tpSize, 1)
	if size > tp.MaxRanks {
		return errorf(errInvalidArgument, "tutti_config.tp_size = %d, want 0..%d", c.tpSize, tp.MaxRanks)
	}
	if c.tpRank >= size {
		return errorf(errInvalidArgument, "tutti_config.tp_rank = %d, want < tp_size (%d)", c.tpRank, size)
	}
	return nil
}

// shardGeometry is the geometry rank tp_rank stores: runtime/tp's rule (the
// one home of how heads are split).
func (c config) shardGeometry(g kvshape.Geometry) (kvshape.Geometry, error) {
	if c.tpSize <= 1 {
		return g, nil
	}
	sg, err := tp.ShardGeometry(g, int(c.tpSize))
	if err != nil {
		return g, &abiError{code: errGeometry, msg: "tutti_config (tp_size)", err: err}
	}
	return sg, nil
}

func rankLine(rank, size uint32) string { return fmt.Sprintf("tutti tp rank %d of %d\n", rank, size) }

// markRank checks every dir's rank marker against (rank, size) and writes it
// where there is none (atomically: a temporary file renamed). It runs after
// runtime.Open, which holds the directories' locks, so no other store writes
// a marker concurrently.
func markRank(dirs []string, rank, size uint32) error {
	want := rankLine(rank, size)
	for _, d := range dirs {
		p := filepath.Join(d, rankFile)
		got, err := os.ReadFile(p)
		switch {
		case err == nil:
			if string(got) != want {
				return errorf(errGeometry, "store directory %s holds %q, this store is %q: each rank needs its own directories",
					d, strings.TrimSpace(string(got)), strings.TrimSpace(want))
			}
			continue
		case !errors.Is(err, os.ErrNotExist):
			return errorf(errIO, "reading %s: %v", p, err)
		}
		tmp := p + ".tmp"
		if err := os.WriteFile(tmp, []byte(want), 0o644); err != nil {
			return errorf(errIO, "writing %s: %v", tmp, err)
		}
		if err := os.Rename(tmp, p); err != nil {
			return errorf(errIO, "renaming %s: %v", tmp, err)
		}
	}
	return nil
}
