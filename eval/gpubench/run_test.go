package gpubench

import (
	"slices"
	"testing"
)

func TestSplitStorePaths(t *testing.T) {
	for _, c := range []struct {
		in             string
		kernels, store []string
	}{
		{"gpu,store-cpu, uring,store-gpu", []string{"gpu", "uring"}, []string{"store-cpu", "store-gpu"}},
		{"store-cpu", nil, []string{"store-cpu"}},
		{"gpu-kick,,per-block", []string{"gpu-kick", "per-block"}, nil},
	} {
		k, s := splitStorePaths(c.in)
		if !slices.Equal(k, c.kernels) || !slices.Equal(s, c.store) {
			t.Errorf("%q: %v %v, want %v %v", c.in, k, s, c.kernels, c.store)
		}
	}
}
