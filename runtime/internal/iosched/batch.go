package iosched

// Batch is one device's share of a save's writes or a load's reads, as its
// device model takes it (ObserveReads, ObserveWrites): bytes and ops
// submitted, from the first submission to the last completion. Busy time is
// the span in which the I/O was in flight, which is what the model wants
// (not per-I/O latencies, which include queueing behind each other).
type Batch struct {
	Bytes, Ops, FirstNs, LastNs int64
}

// Start counts one I/O of bytes submitted at nowNs.
func (b *Batch) Start(nowNs, bytes int64) {
	if b.Ops == 0 {
		b.FirstNs = nowNs
	}
	b.Bytes += bytes
	b.Ops++
}

// BatchOf is device dev's entry of bs, grown to hold it (a store's devices
// are few: one per directory).
func BatchOf(bs *[]Batch, dev int) *Batch {
	if dev >= len(*bs) {
		*bs = append(*bs, make([]Batch, dev+1-len(*bs))...)
	}
	return &(*bs)[dev]
}
