package runtime

import (
	"slices"
	"testing"
)

func TestRunSizes(t *testing.T) {
	for _, tc := range []struct {
		n, m int
		root bool
		want []int
	}{
		{1, 1, true, []int{1}},
		{2, 1, true, []int{1, 1}},
		{5, 1, true, []int{1, 1, 2, 1}},
		{24, 1, true, []int{1, 1, 2, 4, 8, 8}},
		{24, 1, false, []int{24}},
		{100, 16, true, []int{16, 16, 32, 36}},
		{10, 16, true, []int{10}},
	} {
		if got := runSizes(tc.n, tc.m, tc.root); !slices.Equal(got, tc.want) {
			t.Errorf("runSizes(%d, %d, %v) = %v, want %v", tc.n, tc.m, tc.root, got, tc.want)
		}
	}
	// Reading the first k blocks of a root save reads at most max(2k, m).
	for _, m := range []int{1, 3, 16} {
		for n := 1; n <= 300; n++ {
			sizes := runSizes(n, m, true)
			start := 0
			for _, sz := range sizes {
				for k := start + 1; k <= start+sz; k++ {
					if read := start + sz; read > max(2*k, m) {
						t.Fatalf("n=%d m=%d: the first %d blocks read %d", n, m, k, read)
					}
				}
				start += sz
			}
			if start != n {
				t.Fatalf("n=%d m=%d: sizes %v sum to %d", n, m, sizes, start)
			}
		}
	}
}
