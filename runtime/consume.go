package runtime

import "github.com/tutti-io/tutti/sched"

// consumeJob is one completed staging slot of a load for the store's
// consume pool (Store.consumers, PathCPU only), which verifies and scatters
// it (CRC32C of each chunk, then the copy from staging into the KV pages):
// on PathCPU that is the CPU work of a restore, enough that one goroutine per
// load would cap a restore below what fast devices deliver. Every segment
// goes there, a split read's in any order (splitread.go). A job holds its
// slot until the worker releases it, so the queue (one entry per slot) never
// fills; workers never block (each load's result channel has room for every
// segment of the load).
type consumeJob struct {
	l  *Load
	sl *slot
}

func newConsumePool(slots int) *workerPool[consumeJob] {
	return newWorkerPool(slots, func(j consumeJob) { j.l.consumeSegment(j.sl) })
}

// consumed is a segment a worker finished: the driver retires its read
// when readDone (the read's last segment to be consumed).
type consumed struct {
	io            sched.IO
	overreadBytes int64
	readDone      bool
}
