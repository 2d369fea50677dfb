package emudev

import "sync"

// pacer is one direction (reads or writes) of one emulated device: a
// first-come first-served server of bytesPerSec. A request of n bytes
// finishes when the device, busy with every request reserved before it,
// would have moved its n bytes; idle time earns nothing, so no burst
// follows an idle spell (where blk-throttle admits a slice of its rate at
// once and a short transfer runs at the host's speed).
type pacer struct {
	mu          sync.Mutex
	bytesPerSec int64
	freeNs      int64 // when the device is done with everything reserved
}

// reserve books n bytes arriving at nowNs and returns when they are done
// (ns on the same clock). A zero rate means no pacing: nowNs.
func (p *pacer) reserve(nowNs, n int64) int64 {
	if p.bytesPerSec <= 0 {
		return nowNs
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	start := max(nowNs, p.freeNs)
	// n ≤ fusefile.MaxRequestBytes (2^20) and 1e9 keep the product far from overflow.
	p.freeNs = start + (n*1_000_000_000+p.bytesPerSec-1)/p.bytesPerSec
	return p.freeNs
}
