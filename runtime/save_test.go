package runtime

import (
	"slices"
	"testing"
)

func TestRunSizes(t *testing.T) {
	for _, tc := range []struct {
		n    int
		root bool
		want []int
	}{
		{1, true, []int{1}},
		{2, true, []int{1, 1}},
		{5, true, []int{1, 1, 2, 1}},
		{24, true, []int{1, 1, 2, 4, 8, 8}},
		{24, false, []int{24}},
	} {
		if got := runSizes(tc.n, tc.root); !slices.Equal(got, tc.want) {
			t.Errorf("runSizes(%d, %v) = %v, want %v", tc.n, tc.root, got, tc.want)
		}
	}
	// Reading the first k blocks of a root save reads at most 2k blocks.
	for n := 1; n <= 300; n++ {
		sizes := runSizes(n, true)
		start := 0
		for _, sz := range sizes {
			for k := start + 1; k <= start+sz; k++ {
				if read := start + sz; read > 2*k {
					t.Fatalf("n=%d: the first %d blocks read %d", n, k, read)
				}
			}
			start += sz
		}
		if start != n {
			t.Fatalf("n=%d: sizes %v sum to %d", n, sizes, start)
		}
	}
}
