package prefix

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestDataDriven runs the scripts in testdata/. Commands:
//
//	new capacity=BYTES [max-blocks=N]
//	reserve chain=ID,ID,... [from=I] bytes=BYTES_PER_BLOCK
//	commit ids=ID,... [locs=LOC,...]        (default loc: 1000+id)
//	abort ids=ID,...
//	lookup chain=...   pin chain=...   unpin chain=...
//	remove id=ID
//	evict bytes=N      set-capacity bytes=N
//	state              (every block, then the LRU list, next victim first)
//	stats
//
// Every command prints its side effects; after each one the index's invariants are checked.
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var x *Index
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "new" && x == nil {
				d.Fatalf(t, "no index: start with new")
			}
			out := runCmd(t, d, &x)
			if x != nil {
				if err := x.Check(); err != nil {
					d.Fatalf(t, "invariant: %v", err)
				}
			}
			return out
		})
	})
}

func ddIDs(t *testing.T, d *datadriven.TestData, key string) []uint64 {
	arg, ok := d.Arg(key)
	if !ok {
		d.Fatalf(t, "missing %s=", key)
	}
	var ids []uint64
	for _, v := range arg.Vals {
		for _, f := range strings.Split(v, ",") {
			if f == "" {
				continue
			}
			id, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
			if err != nil {
				d.Fatalf(t, "%s: %v", key, err)
			}
			ids = append(ids, id)
		}
	}
	return ids
}

func ddInt(t *testing.T, d *datadriven.TestData, key string, def int64) int64 {
	if !d.HasArg(key) {
		return def
	}
	var v int64
	d.ScanArgs(t, key, &v)
	return v
}

func fmtDropped(ds []Dropped) string {
	if len(ds) == 0 {
		return "-"
	}
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = fmt.Sprintf("%d@%d", d.ID, d.Loc)
	}
	return strings.Join(parts, " ")
}

func fmtErr(err error) string {
	if err != nil {
		return "error: " + err.Error() + "\n"
	}
	return ""
}

func runCmd(t *testing.T, d *datadriven.TestData, xp **Index) string {
	x := *xp
	switch d.Cmd {
	case "new":
		nx, err := New(Config{CapacityBytes: ddInt(t, d, "capacity", 0), MaxBlocks: int(ddInt(t, d, "max-blocks", 0))})
		if err != nil {
			return fmtErr(err)
		}
		*xp = nx
		return "ok"
	case "reserve":
		r, err := x.Reserve(ddIDs(t, d, "chain"), int(ddInt(t, d, "from", 0)), ddInt(t, d, "bytes", 0))
		if err != nil {
			return fmtErr(err)
		}
		return fmt.Sprintf("reserved %d from %d, stop=%s\nevicted: %s", r.N, r.From, r.Stop, fmtDropped(r.Evicted))
	case "commit":
		ids := ddIDs(t, d, "ids")
		var locs []uint64
		if d.HasArg("locs") {
			locs = ddIDs(t, d, "locs")
		} else {
			for _, id := range ids {
				locs = append(locs, 1000+id)
			}
		}
		dropped, err := x.Commit(ids, locs)
		return fmtErr(err) + "dropped: " + fmtDropped(dropped)
	case "abort":
		dropped, err := x.Abort(ddIDs(t, d, "ids"))
		return fmtErr(err) + "dropped: " + fmtDropped(dropped)
	case "lookup":
		return fmt.Sprintf("hit %d", x.Lookup(ddIDs(t, d, "chain")))
	case "pin":
		return fmt.Sprintf("pinned %d", pinN(x, ddIDs(t, d, "chain")))
	case "unpin":
		dropped, err := x.Unpin(ddIDs(t, d, "chain"))
		return fmtErr(err) + "dropped: " + fmtDropped(dropped)
	case "remove":
		dropped, err := x.Remove(uint64(ddInt(t, d, "id", 0)))
		return fmtErr(err) + "dropped: " + fmtDropped(dropped)
	case "evict":
		return "evicted: " + fmtDropped(x.Evict(ddInt(t, d, "bytes", 0)))
	case "set-capacity":
		dropped, err := x.SetCapacity(ddInt(t, d, "bytes", 0))
		return fmtErr(err) + "evicted: " + fmtDropped(dropped)
	case "state":
		return fmtState(x)
	case "stats":
		s := x.Stats()
		return fmt.Sprintf("blocks=%d pending=%d resident=%d pinned=%d draining=%d evictable=%d\n"+
			"bytes=%d pending=%d pinned=%d evictable=%d capacity=%d\n"+
			"reserved=%d committed=%d aborted=%d evictions=%d evicted-bytes=%d removed=%d refused-capacity=%d refused-blocks=%d",
			s.Blocks, s.Pending, s.Resident, s.Pinned, s.Draining, s.Evictable,
			s.Bytes, s.PendingBytes, s.PinnedBytes, s.EvictableBytes, s.CapacityBytes,
			s.Reserved, s.Committed, s.Aborted, s.Evictions, s.EvictedBytes, s.Removed, s.RefusedCapacity, s.RefusedBlocks)
	}
	d.Fatalf(t, "unknown command %q", d.Cmd)
	return ""
}

// fmtState lists every block by id, then the LRU list.
func fmtState(x *Index) string {
	x.mu.Lock()
	var ids []uint64
	for s := int32(0); s < x.sl.n; s++ {
		if e := x.sl.at(s); e.state != stateFree {
			ids = append(ids, e.id)
		}
	}
	x.mu.Unlock()
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	var b strings.Builder
	for _, id := range ids {
		e, _ := x.Get(id)
		parent := "-"
		if e.HasParent {
			parent = strconv.FormatUint(e.Parent, 10)
		}
		fmt.Fprintf(&b, "%d: parent=%s %s", id, parent, e.State)
		if e.Pins > 0 {
			fmt.Fprintf(&b, " pins=%d", e.Pins)
		}
		if e.Draining {
			b.WriteString(" draining")
		}
		fmt.Fprintf(&b, " size=%d loc=%d\n", e.SizeBytes, e.Loc)
	}
	lru := x.LRU()
	parts := make([]string, len(lru))
	for i, id := range lru {
		parts[i] = strconv.FormatUint(id, 10)
	}
	fmt.Fprintf(&b, "lru: %s", strings.Join(parts, " "))
	return b.String()
}
