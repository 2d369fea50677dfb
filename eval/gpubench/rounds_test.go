package gpubench

import (
	"fmt"
	"strings"
	"testing"
)

func TestMergeRounds(t *testing.T) {
	row := func(path string, bps, ceil, cpu float64, ios int64) Row {
		return Row{Path: path, BytesPerS: bps, CeilingBytesPS: ceil, CeilingCachedBytesPS: 2 * ceil, CeilingFraction: bps / ceil, CPUSPerGiB: cpu, IOs: ios}
	}
	t.Run("medians", func(t *testing.T) {
		rounds := [][]Row{
			{row("gpu", 10, 20, 0.3, 1), row("cpu", 5, 20, 0.9, 1)},
			{atPosition(withWorkers(row("gpu", 14, 14, 0.1, 2), 2), 1), atPosition(row("cpu", 7, 14, 0.8, 2), 0)},
			{row("gpu", 12, 16, 0.2, 3), row("cpu", 6, 16, 0.7, 3)},
		}
		got, err := mergeRounds(rounds)
		if err != nil {
			t.Fatal(err)
		}
		g := got[0]
		// median bytes/s 12 is round 3: its other columns come along
		if g.BytesPerS != 12 || g.IOs != 3 || g.Rounds != 3 {
			t.Errorf("gpu row %+v: want round 3's 12 B/s, 3 I/Os, 3 rounds", g)
		}
		// fractions 0.5, 1.0, 0.75: median 0.75; CPU 0.2; ceiling 16
		if g.CeilingFraction != 0.75 || g.CPUSPerGiB != 0.2 || g.CeilingBytesPS != 16 || g.CeilingCachedBytesPS != 32 {
			t.Errorf("gpu row fraction %v cpu %v ceiling %v cached %v: want 0.75 0.2 16 32", g.CeilingFraction, g.CPUSPerGiB, g.CeilingBytesPS, g.CeilingCachedBytesPS)
		}
		if len(g.PerRound.BytesPerS) != 3 || g.PerRound.BytesPerS[1] != 14 {
			t.Errorf("per-round bytes/s %v", g.PerRound.BytesPerS)
		}
		if fmt.Sprint(g.PerRound.Position) != "[0 1 0]" {
			t.Errorf("per-round positions %v, want [0 1 0]", g.PerRound.Position)
		}
		if fmt.Sprint(g.PerRound.IOWQWorkers) != "[0 2 0]" {
			t.Errorf("per-round io-wq workers %v, want [0 2 0]", g.PerRound.IOWQWorkers)
		}
		if c := got[1]; c.BytesPerS != 6 || c.CPUSPerGiB != 0.8 {
			t.Errorf("cpu row %+v: want 6 B/s, 0.8 CPU s/GiB", c)
		}
	})
	t.Run("even count takes the lower middle", func(t *testing.T) {
		got, err := mergeRounds([][]Row{{row("gpu", 9, 10, 0, 1)}, {row("gpu", 3, 10, 0, 2)}})
		if err != nil || got[0].BytesPerS != 3 || got[0].IOs != 2 {
			t.Errorf("got %+v, %v: want round 2 (3 B/s)", got, err)
		}
	})
	t.Run("one failed round fails the path", func(t *testing.T) {
		bad := row("gpu", 11, 10, 0.1, 2)
		bad.Error, bad.Mismatches = "verify: 4 words", 4
		got, err := mergeRounds([][]Row{{row("gpu", 10, 10, 0.1, 1)}, {bad}, {row("gpu", 12, 10, 0.1, 3)}})
		if err != nil {
			t.Fatal(err)
		}
		g := got[0]
		if g.BytesPerS != 0 || g.CeilingFraction != 0 || g.Mismatches != 4 || !strings.Contains(g.Error, "round 2 of 3: verify") {
			t.Errorf("got %+v: want no throughput, 4 mismatches, round 2's error", g)
		}
	})
	t.Run("mismatches add up", func(t *testing.T) {
		a, b := row("gpu", 10, 10, 0, 1), row("gpu", 10, 10, 0, 1)
		a.Mismatches, b.Mismatches = 1, 2
		got, _ := mergeRounds([][]Row{{a}, {b}})
		if got[0].Mismatches != 3 {
			t.Errorf("mismatches %d, want 3", got[0].Mismatches)
		}
	})
	t.Run("rounds must run the same paths", func(t *testing.T) {
		if _, err := mergeRounds([][]Row{{row("gpu", 1, 1, 0, 0)}, {row("cpu", 1, 1, 0, 0)}}); err == nil {
			t.Error("different paths merged")
		}
		if _, err := mergeRounds([][]Row{{row("gpu", 1, 1, 0, 0)}, {}}); err == nil {
			t.Error("different path counts merged")
		}
	})
}

func withWorkers(r Row, n int) Row {
	r.IOWQWorkers = n
	return r
}

// roundOrder: every round runs every path once; over 2n rounds every path
// runs in every position twice; after every even number of rounds every
// path has run before every other in exactly half of them.
func TestRoundOrder(t *testing.T) {
	if got := fmt.Sprint(roundOrder(2, 0), roundOrder(2, 1), roundOrder(2, 2), roundOrder(2, 3)); got != "[0 1] [1 0] [1 0] [0 1]" {
		t.Errorf("two paths: %s", got)
	}
	if got := fmt.Sprint(roundOrder(3, 0), roundOrder(3, 1), roundOrder(3, 2), roundOrder(3, 3)); got != "[0 1 2] [2 1 0] [1 2 0] [0 2 1]" {
		t.Errorf("three paths: %s", got)
	}
	for n := 1; n <= 6; n++ {
		atPos := make([][]int, n) // atPos[path][position]
		for i := range atPos {
			atPos[i] = make([]int, n)
		}
		before := make([][]int, n) // before[i][j]: rounds where i ran before j
		for i := range before {
			before[i] = make([]int, n)
		}
		for k := 0; k < 2*n; k++ {
			o := roundOrder(n, k)
			seen := make([]bool, n)
			for pos, p := range o {
				if p < 0 || p >= n || seen[p] {
					t.Fatalf("n %d round %d: order %v is not a permutation", n, k, o)
				}
				seen[p] = true
				atPos[p][pos]++
				for _, q := range o[pos+1:] {
					before[p][q]++
				}
			}
			if k%2 == 1 {
				for i := 0; i < n; i++ {
					for j := 0; j < n; j++ {
						if i != j && before[i][j] != (k+1)/2 {
							t.Fatalf("n %d after %d rounds: %d ran before %d in %d rounds, want %d", n, k+1, i, j, before[i][j], (k+1)/2)
						}
					}
				}
			}
		}
		for p := range atPos {
			for pos, c := range atPos[p] {
				if c != 2 {
					t.Errorf("n %d: path %d ran at position %d in %d of %d rounds, want 2", n, p, pos, c, 2*n)
				}
			}
		}
	}
}

func atPosition(r Row, pos int) Row { r.position = pos; return r }
