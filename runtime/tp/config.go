package tp

import (
	"errors"
	"fmt"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
	"github.com/tutti-io/tutti/uring"
)

// MaxRanks bounds a group (tensor-parallel degrees beyond one host's GPUs
// are not this package's business).
const MaxRanks = 64

// ErrConfig is wrapped by every Config.Validate error.
var ErrConfig = errors.New("tp: invalid config")

// Config is what Open needs.
type Config struct {
	// Ranks is the tensor-parallel degree N (1..MaxRanks).
	Ranks int
	// Store is the template of every rank's store. Its Geometry is the
	// WHOLE model's (all KV heads); each rank's store gets ShardGeometry.
	// Its Dirs are ignored (see Dirs); CapacityBytes, staging, queue depth
	// and the rest apply to each rank alone. Store.GPU.Device is ignored on
	// PathGPU (see Devices).
	Store runtime.Config
	// Dirs[r] are rank r's store directories: its own, never shared (each
	// store locks its directories). len(Dirs) == Ranks.
	Dirs [][]string
	// Devices[r] is rank r's CUDA device on PathGPU. Nil: rank r uses
	// device r mod (visible GPUs), so N ranks run on one GPU too (each with
	// its own ring, staging and restorer), which is how the N-GPU code is
	// exercised on a one-GPU machine.
	Devices []int
	// NewEngine, if set, makes rank r's I/O engine instead of a real
	// io_uring ring (tests: a seeded uringsim.Sim with faults on one rank).
	NewEngine func(rank int) (uring.Engine, error)
}

func configErr(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrConfig, field, fmt.Sprintf(format, args...))
}

// ShardGeometry returns the geometry one of ranks tensor-parallel ranks
// stores. With separate K and V planes (MHA/GQA) the KV heads are split
// evenly: rank r holds heads [r*H/N, (r+1)*H/N), so KVHeads must be a
// multiple of ranks (vLLM's replication of KV heads when N > KVHeads is not
// supported). A single latent plane (MLA) is not split by heads: every rank
// holds the whole latent cache, as vLLM keeps it, so the shard geometry is
// the model's.
func ShardGeometry(g kvshape.Geometry, ranks int) (kvshape.Geometry, error) {
	if ranks < 1 || ranks > MaxRanks {
		return kvshape.Geometry{}, configErr("Ranks", "must be in [1, %d], got %d", MaxRanks, ranks)
	}
	if err := g.Validate(); err != nil {
		return kvshape.Geometry{}, configErr("Store.Geometry", "%v", err)
	}
	if g.Planes == 1 {
		return g, nil
	}
	if g.KVHeads%ranks != 0 {
		return kvshape.Geometry{}, configErr("Store.Geometry.KVHeads", "%d KV heads cannot be split evenly over %d ranks (KVHeads %% Ranks = %d)",
			g.KVHeads, ranks, g.KVHeads%ranks)
	}
	g.KVHeads /= ranks
	return g, nil
}

// Replicated reports whether every rank holds the whole cache (a latent
// plane, MLA) rather than a slice of the heads.
func Replicated(g kvshape.Geometry) bool { return g.Planes == 1 }

// Validate reports the first field that is wrong, by name. Each rank's
// store config is validated as well (runtime.Config.Validate), so an error
// there names the rank.
func (c *Config) Validate() error {
	shard, err := ShardGeometry(c.Store.Geometry, c.Ranks)
	if err != nil {
		return err
	}
	if len(c.Dirs) != c.Ranks {
		return configErr("Dirs", "%d ranks need %d directory lists, got %d", c.Ranks, c.Ranks, len(c.Dirs))
	}
	owner := make(map[string]int)
	for r, ds := range c.Dirs {
		if len(ds) == 0 {
			return configErr(fmt.Sprintf("Dirs[%d]", r), "rank %d has no directory", r)
		}
		for _, d := range ds {
			if o, ok := owner[d]; ok && o != r {
				return configErr(fmt.Sprintf("Dirs[%d]", r), "%q is rank %d's too: every rank needs its own directories", d, o)
			}
			owner[d] = r
		}
	}
	if c.Devices != nil {
		if len(c.Devices) != c.Ranks {
			return configErr("Devices", "%d ranks need %d devices, got %d", c.Ranks, c.Ranks, len(c.Devices))
		}
		for r, d := range c.Devices {
			if d < 0 {
				return configErr(fmt.Sprintf("Devices[%d]", r), "must be >= 0, got %d", d)
			}
		}
	}
	for r := 0; r < c.Ranks; r++ {
		rc := c.rankConfig(r, shard, 0)
		if err := rc.Validate(); err != nil {
			return fmt.Errorf("%w: rank %d: %w", ErrConfig, r, err)
		}
	}
	return nil
}

// rankConfig is rank r's store config.
func (c *Config) rankConfig(r int, shard kvshape.Geometry, device int) runtime.Config {
	rc := c.Store
	rc.Dirs = append([]string(nil), c.Dirs[r]...)
	rc.Geometry = shard
	rc.GPU.Device = device
	if c.NewEngine != nil {
		rc.NewEngine = func() (uring.Engine, error) { return c.NewEngine(r) }
	}
	return rc
}
