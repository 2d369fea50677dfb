package workpool

import (
	"sync/atomic"
	"testing"
)

// TestPool: every queued job runs once, Close waits for them.
func TestPool(t *testing.T) {
	var sum atomic.Int64
	p := New(100, func(j int) { sum.Add(int64(j)) })
	for j := 1; j <= 100; j++ {
		p.Submit(j)
	}
	p.Close()
	if sum.Load() != 5050 {
		t.Fatalf("sum %d, want 5050", sum.Load())
	}
}
