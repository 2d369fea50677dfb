package sim

// The simulated world's state and its event loop; the handlers are in
// requests.go (requests, the GPU, saves) and devices.go (device lanes,
// dispatch), the cache in lru.go.

import (
	"fmt"

	"github.com/tutti-io/tutti/sched"
)

type evKind uint8

const (
	evArrival   evKind = iota + 1
	evLayerDone        // a = request, b = layer
	evLaneDone         // a = device·2 + lane, b = lane generation
	evIODone           // a = op
	evWake             // planner's NextWakeNs
)

type event struct {
	t    int64
	seq  uint64
	kind evKind
	a, b int
}

type eventHeap struct{ h []event }

func (q *eventHeap) Len() int { return len(q.h) }

func (q *eventHeap) less(i, j int) bool {
	if q.h[i].t != q.h[j].t {
		return q.h[i].t < q.h[j].t
	}
	return q.h[i].seq < q.h[j].seq
}

func (q *eventHeap) push(e event) {
	q.h = append(q.h, e)
	for j := len(q.h) - 1; j > 0; {
		p := (j - 1) / 2
		if !q.less(j, p) {
			break
		}
		q.h[j], q.h[p] = q.h[p], q.h[j]
		j = p
	}
}

func (q *eventHeap) pop() event {
	top := q.h[0]
	n := len(q.h) - 1
	q.h[0] = q.h[n]
	q.h = q.h[:n]
	for j := 0; ; {
		l := 2*j + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && q.less(r, l) {
			m = r
		}
		if !q.less(m, j) {
			break
		}
		q.h[j], q.h[m] = q.h[m], q.h[j]
		j = m
	}
	return top
}

const (
	laneRead  = 0
	laneWrite = 1
)

type op struct {
	write      bool
	dev        int
	req        int // request index (read) or save index (write)
	layer      int
	bytes      int64
	workNs     float64 // lane time at full rate
	plannerID  uint64
	startNs    int64
	overlapNs  float64 // time in service while the other lane was busy
	identity   uint64
	hasPlanner bool
}

type lane struct {
	queue     []int // ops waiting, FIFO
	cur       int   // op in service, −1 none
	remaining float64
	rate      float64
	lastNs    int64
	gen       int
}

type device struct {
	lanes [2]lane
	fifo  []int // baseline policies: ops not yet handed to a lane
	rpend []int // load-all / recompute-all: reads and writes waiting
	wpend []int
}

type reqState struct {
	req       *Request
	cached    int // P
	load      int // k
	segs      []sched.Run
	readsLeft []int // per layer
	tokens    int   // computed
	startPos  int
	layerAt   int64
	finishNs  int64
	done      bool

	predGPUNs, predLayerNs int64 // scheduler: the plan's GPU time and layer time
}

type save struct {
	enqNs      int64
	writesLeft int
	ids        []uint64
	run        int
}

type state struct {
	cfg     Config
	now     int64
	events  eventHeap
	seq     uint64
	nEvents int
	reqs    []reqState
	devs    []device
	ops     []op
	saves   []save
	cache   *lru
	planner *sched.Planner
	ioBuf   []sched.IO
	res     Result

	saveBoundNs int64
	wakeAt      int64 // pending wake event time, 0 none

	// GPU
	gpuQueue   []int
	gpuHead    int
	gpuCur     int // −1 idle
	gpuLayer   int
	gpuBusy    bool
	gpuWaiting int64 // start of the current wait for reads, −1 none
}

func (s *state) push(t int64, k evKind, a, b int) {
	s.seq++
	s.events.push(event{t: t, seq: s.seq, kind: k, a: a, b: b})
}

func (s *state) handle(ev event) error {
	switch ev.kind {
	case evArrival:
		return s.arrive(ev.a)
	case evLayerDone:
		return s.layerDone(ev.a, ev.b)
	case evLaneDone:
		d, ln := ev.a/2, ev.a%2
		if s.devs[d].lanes[ln].gen != ev.b {
			return nil // re-timed since
		}
		return s.serviceDone(d, ln)
	case evIODone:
		return s.ioDone(ev.a)
	case evWake:
		if ev.t != s.wakeAt {
			return nil
		}
		s.wakeAt = 0
		return s.dispatch()
	}
	return fmt.Errorf("unknown event %+v", ev)
}
