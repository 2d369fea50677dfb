package runtime

import (
	goruntime "runtime"
	"sync"
)

// maxPoolWorkers bounds the goroutines of each of a store's worker pools.
const maxPoolWorkers = 8

// workerPool runs do on every job queued to it, on min(GOMAXPROCS,
// maxPoolWorkers) goroutines shared by the store's loads (the consume pool)
// or saves (the stage pool). Its queue holds queueLen jobs: callers size it
// so that queueing never blocks (one job per staging slot or write buffer).
type workerPool[J any] struct {
	jobs chan J
	wg   sync.WaitGroup
}

func newWorkerPool[J any](queueLen int, do func(J)) *workerPool[J] {
	n := min(goruntime.GOMAXPROCS(0), maxPoolWorkers)
	p := &workerPool[J]{jobs: make(chan J, queueLen)}
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

// submit queues j.
func (p *workerPool[J]) submit(j J) { p.jobs <- j }

// close stops the workers once the queued jobs are done; no job may be
// queued after it (Close calls it once every load and save ended).
func (p *workerPool[J]) close() {
	close(p.jobs)
	p.wg.Wait()
}
