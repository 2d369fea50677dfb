package main

import (
	"testing"

	"github.com/tutti-io/tutti/runtime"
)

// BenchmarkLookupPath is the Go side of tutti_lookup (handle table, count
// check, index lookup) next to runtime.Store.Lookup alone: what the ABI layer
// adds before the cgo and ctypes costs (BENCHMARKS.md, python).
func BenchmarkLookupPath(b *testing.B) {
	c := goodConfig()
	c.dirs = []string{b.TempDir()}
	rc, err := c.runtimeConfig()
	if err != nil {
		b.Fatal(err)
	}
	s, err := runtime.Open(rc)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	h, err := handles.add(kindStore, &storeEntry{s: s, cfg: rc})
	if err != nil {
		b.Fatal(err)
	}
	defer handles.take(h, kindStore)
	chain := make([]uint64, 32)
	for i := range chain {
		chain[i] = uint64(i + 1)
	}
	b.Run("runtime", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			s.Lookup(chain)
		}
	})
	b.Run("abi", func(b *testing.B) { // tutti_lookup: handle, count check, view
		for i := 0; i < b.N; i++ {
			e, err := storeArg(h)
			if err != nil {
				b.Fatal(err)
			}
			if err := countArg("chain length", uint64(len(chain)), maxChainBlocks); err != nil {
				b.Fatal(err)
			}
			e.s.Lookup(chain)
		}
	})
}
