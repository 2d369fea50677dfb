package runtime

import (
	goruntime "runtime"
	"sync"

	"github.com/tutti-io/tutti/sched"
)

// maxConsumeWorkers bounds the consume goroutines of a store.
const maxConsumeWorkers = 8

// consumePool verifies and scatters completed load reads (CRC32C of each
// chunk, then the copy from staging into the KV pages) on min(GOMAXPROCS, 8)
// goroutines shared by the store's loads. On PathCPU that is the CPU work
// of a restore, enough that one goroutine per load would cap a restore
// below what fast devices deliver. Only reads that are one staging segment (one slot holds the whole
// (layer, run) read) go here: a split read carries its chunk verifier from
// one segment to the next, so its driver consumes it in order.
//
// A job holds a staging slot until the worker releases it, so the queue
// (one entry per slot) never fills; workers never block (each load's
// result channel has room for every read of the load).
type consumePool struct {
	jobs chan consumeJob
	wg   sync.WaitGroup
}

type consumeJob struct {
	l  *Load
	sl *slot
}

// consumed is a segment a worker finished: the driver retires its read
// when readDone (the read's last segment to be consumed).
type consumed struct {
	io            sched.IO
	overreadBytes int64
	readDone      bool
}

func newConsumePool(slots int) *consumePool {
	n := min(goruntime.GOMAXPROCS(0), maxConsumeWorkers)
	p := &consumePool{jobs: make(chan consumeJob, slots)}
	p.wg.Add(n)
	for range n {
		go p.run()
	}
	return p
}

func (p *consumePool) run() {
	defer p.wg.Done()
	for j := range p.jobs {
		j.l.consumeSegment(j.sl)
	}
}

// close stops the workers once the queued jobs are done; no job may be
// queued after it (Close calls it once every load ended).
func (p *consumePool) close() {
	close(p.jobs)
	p.wg.Wait()
}
