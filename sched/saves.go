package sched

import (
	"fmt"
	"math"
)

// EnqueueSave admits the leading blocks of a save that fit the device's
// pending save bytes and its save bound, cuts them into writes and queues
// them. It never blocks; SaveTicket.Blocks == 0 means nothing was admitted.
// The writes come out of Dispatch: into read slack when they can, promoted
// when their bound comes near.
func (p *Planner) EnqueueSave(req SaveRequest) (SaveTicket, error) {
	if req.Device < 0 || req.Device >= len(p.devs) || req.Blocks <= 0 || req.BytesPerLayerPerBlock <= 0 {
		return SaveTicket{}, fmt.Errorf("enqueue save %d: %+v: %w", req.ID, req, ErrBadRequest)
	}
	d := &p.devs[req.Device]
	L := int64(p.cfg.Layers)
	perBlock := L * req.BytesPerLayerPerBlock
	// Write time budget: all queued and in-flight write work, at the share
	// writes get next to reads, must fit the bound less two margins.
	ws := d.model.WriteShare()
	budgetNs := float64(p.cfg.SaveBoundNs-2*p.cfg.SlackMarginNs)*ws - d.queuedSaveNs - d.inflightWriteNs
	writeNs := func(blocks int) (float64, int) {
		per := int64(blocks) * req.BytesPerLayerPerBlock
		full := per / p.cfg.MaxWriteIOBytes
		rest := per % p.cfg.MaxWriteIOBytes
		ns := float64(full) * d.model.WriteNs(p.cfg.MaxWriteIOBytes)
		n := full
		if rest > 0 {
			ns += d.model.WriteNs(rest)
			n++
		}
		return float64(L) * ns, int(L * n)
	}
	blocks, reason := req.Blocks, ReasonNone
	if room := d.cfg.MaxPendingSaveBytes - d.pendingSaveBytes; int64(blocks)*perBlock > room {
		blocks, reason = int(max(room, 0)/perBlock), ReasonSaveBudget
	}
	// The write time is monotone in blocks: binary search the largest that fits.
	fits := func(b int) bool {
		ns, n := writeNs(b)
		return ns <= budgetNs && n <= p.cfg.MaxPendingIOs-p.Pending()
	}
	if blocks > 0 && !fits(blocks) {
		lo, hi := 0, blocks // fits(lo), !fits(hi)
		for hi-lo > 1 {
			if m := (lo + hi) / 2; fits(m) {
				lo = m
			} else {
				hi = m
			}
		}
		blocks = lo
		if _, n := writeNs(req.Blocks); n > p.cfg.MaxPendingIOs-p.Pending() {
			reason = ReasonQueueFull
		} else {
			reason = ReasonSaveBound
		}
	}
	p.stats.Saves++
	p.stats.SaveBlocks += int64(blocks)
	p.stats.SaveCutBlocks += int64(req.Blocks - blocks)
	t := SaveTicket{Blocks: blocks, Reason: reason, DeadlineNs: req.NowNs + p.cfg.SaveBoundNs}
	if blocks == 0 {
		return t, nil
	}
	per := int64(blocks) * req.BytesPerLayerPerBlock
	for l := 0; l < p.cfg.Layers; l++ {
		for off := int64(0); off < per; off += p.cfg.MaxWriteIOBytes {
			n := min(p.cfg.MaxWriteIOBytes, per-off)
			idx, _ := p.alloc() // checked by fits
			e := &p.entries[idx]
			p.seq++
			*e = entry{gen: e.gen, state: stateQueued, svcNs: d.model.WriteNs(n), seq: p.seq}
			e.io = IO{ID: p.id(idx), Kind: IOWrite, ReqID: req.ID, Device: req.Device, Layer: l,
				OffsetBytes: off, Bytes: n, DeadlineNs: t.DeadlineNs}
			d.saveQ = append(d.saveQ, idx)
			d.queuedSaveNs += e.svcNs
			d.pendingSaveBytes += n
			t.Writes++
		}
	}
	return t, nil
}

// promoteAtNs is the latest time the device's save queue can start draining
// and still finish every queued write by its deadline less the margin, with
// writes at their share next to reads and after the writes in flight.
func (p *Planner) promoteAtNs(d *devState) int64 {
	ws := d.model.WriteShare()
	cum := d.inflightWriteNs / ws
	at := int64(math.MaxInt64)
	for _, i := range d.saveQ[d.saveHead:] {
		e := &p.entries[i]
		cum += e.svcNs / ws
		at = min(at, e.io.DeadlineNs-p.cfg.SlackMarginNs-ceilNs(cum))
	}
	return at
}
