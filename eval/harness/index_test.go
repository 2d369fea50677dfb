package harness

import (
	"math/rand/v2"
	"testing"
)

func TestIndexLeafFirstLRU(t *testing.T) {
	x := NewIndex(4)
	a := []uint64{1, 2, 3}
	end, ev := x.Admit(a, x.Lookup(a))
	if end != 3 || len(ev) != 0 {
		t.Fatalf("end %d evict %v", end, ev)
	}
	x.Insert(a, 0, end)
	b := []uint64{1, 4, 5} // shares block 1
	hit := x.Lookup(b)
	if hit != 1 {
		t.Fatalf("hit %d", hit)
	}
	end, ev = x.Admit(b, hit)
	// 5 blocks wanted, capacity 4: evict the LRU leaf, 3 (never 1 or 2 while 3 is cached).
	if end != 3 || len(ev) != 1 || ev[0] != 3 {
		t.Fatalf("end %d evict %v", end, ev)
	}
	x.Insert(b, hit, end)
	if x.Len() != 4 || x.Lookup(a) != 2 || x.Lookup(b) != 3 {
		t.Fatalf("len %d, a %d, b %d", x.Len(), x.Lookup(a), x.Lookup(b))
	}
	// A chain longer than the capacity is admitted partially.
	long := []uint64{10, 11, 12, 13, 14, 15}
	end, ev = x.Admit(long, x.Lookup(long))
	if end != 4 || len(ev) != 4 {
		t.Fatalf("end %d evict %v", end, ev)
	}
}

// The cached blocks of any chain always form a prefix (leaf-first), under a
// random workload of chains sharing prefixes.
func TestIndexPrefixProperty(t *testing.T) {
	seed := uint64(7)
	rng := rand.New(rand.NewPCG(seed, 1))
	x := NewIndex(50)
	var chains [][]uint64
	next := uint64(100)
	for i := 0; i < 2000; i++ {
		var c []uint64
		if len(chains) > 0 && rng.IntN(2) == 0 {
			p := chains[rng.IntN(len(chains))]
			c = append(c, p[:1+rng.IntN(len(p))]...)
		}
		for n := rng.IntN(8); n >= 0; n-- {
			c = append(c, next)
			next++
		}
		chains = append(chains, c)
		hit := x.Lookup(c)
		end, _ := x.Admit(c, hit)
		x.Insert(c, hit, end)
		if x.Len() > 50 {
			t.Fatalf("seed %d: %d blocks cached, capacity 50", seed, x.Len())
		}
		for _, cc := range chains[max(0, len(chains)-50):] {
			n := 0
			for n < len(cc) && x.nodes[cc[n]] != nil {
				n++
			}
			for _, id := range cc[n:] {
				if x.nodes[id] != nil {
					t.Fatalf("seed %d: chain %v cached beyond its prefix of %d", seed, cc, n)
				}
			}
		}
	}
}
