package sched

const (
	stateFree uint8 = iota
	stateQueued
	stateInFlight
)

type entry struct {
	io            IO
	gen           uint32
	state         uint8
	pos           int32   // index in the device's in-flight read list
	svcNs         float64 // predicted device busy time at admission
	slackNs       float64 // reads: deadline − planned completion
	plannedDoneNs int64   // reads
	seq           uint64  // FIFO tie-break
}

type devState struct {
	cfg   DeviceConfig
	model DeviceModel

	readQ      []int32 // cursors, min-heap by (deadline of their next read, seq)
	inflightRd []int32 // entries
	inflightWr []int32 // entries, in dispatch order (at most MaxWritesInFlight)
	saveQ      []int32 // FIFO = EDF, the bound is the same for all saves
	saveHead   int

	readsInFlight, writesInFlight         int
	readBytesInFlight, writeBytesInFlight int64
	pendingReadBytes, pendingSaveBytes    int64
	pendingReadNs                         float64 // admitted, not completed reads
	queuedSaveNs                          float64 // queued writes, at full write rate
	inflightWriteNs                       float64
	inflightReadNs                        float64 // predicted busy time of the reads in flight
	plannedTailNs                         int64   // latest planned completion among pending reads
	pendingReads                          int

	// Whole plans' reads (restorejob.go): their cursors (queued or
	// dispatched; never on readQ), the predicted busy time of the layers
	// of the dispatched ones not yet retired, and how many are dispatched.
	jobCurs      []int32
	jobReadNs    float64
	jobsInFlight int
	jobHeld      bool // Dispatch scratch: a job waits so that this device's saves keep their bound

	// scratch of PlanLoad: where the request's reads can start; its reads
	// of every layer (total), of its first layer read here (first, the
	// layer firstL) and the last layer read here (lastL); its reads (n).
	t0, total, first float64
	firstL, lastL    int
	n                int
}

// cursor is the queued reads of one plan on one device: its reads of layer
// 0, then of layer 1, ... (each layer's in segment order; a segment whose
// layer lies on another device has none here). Its place in the device's
// heap is the deadline of its next read.
type cursor struct {
	reqID uint64
	dev   int
	segs  []Segment // the plan's, shared
	reads []cread
	// cumNs and cumB (len(reads)+1) are prefix sums of the reads'
	// predicted busy time and bytes: read i is planned done at t0 +
	// cumNs[i+1].
	cumNs []float64
	cumB  []int64
	// layerAt[l] (len Layers+1) is the first read of layer l or later.
	layerAt  []int32
	deadline []int64 // per layer, shared by the plan's cursors
	t0       float64
	// slackMin and slackMinH (len(reads)+1) are suffix minima over reads
	// ≥ i of deadline − planned done and deadline − (1+SlackFrac)·planned
	// done.
	slackMin  []float64
	slackMinH []float64
	// pos is the next read: not yet dispatched (a queued cursor) or not yet
	// retired (a Whole plan's, where layer is the next layer to retire).
	pos, layer int
	seq        uint64
	live       bool
}

// cread is one read of a cursor: layer layer of segment segs[seg], of
// predicted busy time ns.
type cread struct {
	layer, seg int32
	ns         float64
}

// totalNs is the busy time of all of c's reads.
func (c *cursor) totalNs() float64 { return c.cumNs[len(c.reads)] }

// nextDeadline is the deadline of c's next read.
func (c *cursor) nextDeadline() int64 { return c.deadline[c.reads[c.pos].layer] }

// remaining returns the reads, bytes and busy time not yet dispatched (or
// retired).
func (c *cursor) remaining() (n int, bytes int64, ns float64) {
	end := len(c.reads)
	return end - c.pos, c.cumB[end] - c.cumB[c.pos], c.cumNs[end] - c.cumNs[c.pos]
}

func (p *Planner) alloc() (int32, bool) {
	if p.Pending() >= p.cfg.MaxPendingIOs {
		return 0, false
	}
	if n := len(p.free); n > 0 {
		i := p.free[n-1]
		p.free = p.free[:n-1]
		return i, true
	}
	p.entries = append(p.entries, entry{})
	return int32(len(p.entries) - 1), true
}

func (p *Planner) release(i int32) {
	e := &p.entries[i]
	e.state = stateFree
	e.gen++
	p.free = append(p.free, i)
}

func (p *Planner) id(i int32) uint64 { return uint64(p.entries[i].gen)<<32 | uint64(i) }

func (p *Planner) allocCursor() int32 {
	if n := len(p.cfree); n > 0 {
		i := p.cfree[n-1]
		p.cfree = p.cfree[:n-1]
		return i
	}
	p.cursors = append(p.cursors, cursor{})
	return int32(len(p.cursors) - 1)
}

func (p *Planner) releaseCursor(i int32) {
	p.cursors[i] = cursor{}
	p.cfree = append(p.cfree, i)
}

// ---- read heap (EDF over cursors) ----

func (p *Planner) less(a, b int32) bool {
	ca, cb := &p.cursors[a], &p.cursors[b]
	da, db := ca.nextDeadline(), cb.nextDeadline()
	if da != db {
		return da < db
	}
	return ca.seq < cb.seq
}

func (p *Planner) heapPush(d *devState, i int32) {
	d.readQ = append(d.readQ, i)
	j := len(d.readQ) - 1
	for j > 0 {
		parent := (j - 1) / 2
		if !p.less(d.readQ[j], d.readQ[parent]) {
			break
		}
		d.readQ[j], d.readQ[parent] = d.readQ[parent], d.readQ[j]
		j = parent
	}
}

func (p *Planner) heapDown(h []int32, j int) {
	for {
		l := 2*j + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && p.less(h[r], h[l]) {
			m = r
		}
		if !p.less(h[m], h[j]) {
			return
		}
		h[j], h[m] = h[m], h[j]
		j = m
	}
}

func (p *Planner) heapPop(d *devState) int32 {
	h := d.readQ
	top := h[0]
	h[0] = h[len(h)-1]
	d.readQ = h[:len(h)-1]
	p.heapDown(d.readQ, 0)
	return top
}
