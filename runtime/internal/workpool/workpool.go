// Package workpool runs a store's CPU work on a bounded set of goroutines
// shared by its operations: PathCPU's consume pool (verifying and
// scattering completed reads) and the saves' stage pool (gathering and
// checksumming writes).
package workpool

import (
	goruntime "runtime"
	"sync"
)

// MaxWorkers bounds the goroutines of each pool.
const MaxWorkers = 8

// Pool runs do on every job queued to it, on min(GOMAXPROCS, MaxWorkers)
// goroutines. Its queue holds queueLen jobs: callers size it so that
// queueing never blocks (one job per staging slot or write buffer).
type Pool[J any] struct {
	jobs chan J
	wg   sync.WaitGroup
}

// New starts a pool.
func New[J any](queueLen int, do func(J)) *Pool[J] {
	n := min(goruntime.GOMAXPROCS(0), MaxWorkers)
	p := &Pool[J]{jobs: make(chan J, queueLen)}
	p.wg.Add(n)
	for range n {
		go func() {
			defer p.wg.Done()
			for j := range p.jobs {
				do(j)
			}
		}()
	}
	return p
}

// Submit queues j.
func (p *Pool[J]) Submit(j J) { p.jobs <- j }

// Close stops the workers once the queued jobs are done; no job may be
// queued after it.
func (p *Pool[J]) Close() {
	close(p.jobs)
	p.wg.Wait()
}
