package sched

import (
	"fmt"
	"math"
)

// EnqueueSave admits the leading blocks of a save that fit the pending save
// bytes of each device it writes to and that each such device can write
// within the save bound, cuts them into writes and queues them. It never
// blocks; SaveTicket.Blocks == 0 means nothing was admitted. The writes come
// out of Dispatch: into read slack when they can, promoted when their bound
// comes near (and then reads wait where the writes would otherwise miss it;
// see Dispatch).
//
// A save fits a device when all queued and in-flight write work, this
// save's last, can finish within the bound less two margins beside the
// reads already admitted on the device (saveNeedNs): on an idle device that
// is the full write rate, next to a long read backlog the write share. A
// save spread over several devices (LayerDevices) writes each device's
// layers there, and must fit every one of them.
func (p *Planner) EnqueueSave(req SaveRequest) (SaveTicket, error) {
	if req.Device < 0 || req.Device >= len(p.devs) || req.Blocks <= 0 || req.BytesPerLayerPerBlock <= 0 || !p.validLayerDevices(req.LayerDevices) {
		return SaveTicket{}, fmt.Errorf("enqueue save %d: %+v: %w", req.ID, req, ErrBadRequest)
	}
	p.runShares([]Run{{Device: req.Device, LayerDevices: req.LayerDevices}})
	shares := p.sharesOf(0)
	budgetNs := float64(p.cfg.SaveBoundNs - 2*p.cfg.SlackMarginNs)
	// writeNs is one device's write time of blocks blocks of layers layers
	// (its writes counted), with the write work ahead of it on the device.
	writeNs := func(d *devState, layers int, blocks int) (float64, int) {
		gap := p.writeGapNs(d)
		per := int64(blocks) * req.BytesPerLayerPerBlock
		full := per / p.cfg.MaxWriteIOBytes
		rest := per % p.cfg.MaxWriteIOBytes
		ns := float64(full) * (d.model.WriteNs(p.cfg.MaxWriteIOBytes) + gap)
		n := full
		if rest > 0 {
			ns += d.model.WriteNs(rest) + gap
			n++
		}
		return float64(layers) * ns, layers * int(n)
	}
	blocks, reason := req.Blocks, ReasonNone
	for _, sh := range shares {
		d := &p.devs[sh.dev]
		perBlock := int64(sh.layers) * req.BytesPerLayerPerBlock
		if room := d.cfg.MaxPendingSaveBytes - d.pendingSaveBytes; int64(blocks)*perBlock > room {
			blocks, reason = int(max(room, 0)/perBlock), ReasonSaveBudget
		}
	}
	// The write time is monotone in blocks: binary search the largest that fits.
	writes := func(b int) (n int, fit bool) {
		fit = true
		for _, sh := range shares {
			d := &p.devs[sh.dev]
			aheadNs := d.queuedSaveNs + d.inflightWriteNs + float64(d.queuedWrites()+d.writesInFlight)*p.writeGapNs(d)
			ns, k := writeNs(d, int(sh.layers), b)
			n += k
			fit = fit && saveNeedNs(d.model, aheadNs+ns, d.pendingReadNs) <= budgetNs
		}
		return n, fit
	}
	fits := func(b int) bool {
		n, fit := writes(b)
		return fit && n <= p.cfg.MaxPendingIOs-p.Pending()
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
		if n, _ := writes(req.Blocks); n > p.cfg.MaxPendingIOs-p.Pending() {
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
		dev := layerDevice(req.LayerDevices, req.Device, l)
		d := &p.devs[dev]
		for off := int64(0); off < per; off += p.cfg.MaxWriteIOBytes {
			n := min(p.cfg.MaxWriteIOBytes, per-off)
			idx, _ := p.alloc() // checked by fits
			e := &p.entries[idx]
			p.seq++
			*e = entry{gen: e.gen, state: stateQueued, svcNs: d.model.WriteNs(n), seq: p.seq}
			e.io = IO{ID: p.id(idx), Kind: IOWrite, ReqID: req.ID, Device: dev, Layer: l,
				OffsetBytes: off, Bytes: n, DeadlineNs: t.DeadlineNs}
			d.saveQ = append(d.saveQ, idx)
			d.queuedSaveNs += e.svcNs
			d.pendingSaveBytes += n
			t.Writes++
		}
	}
	return t, nil
}

// saveNeedNs is how long the device takes to finish writeNs of write work
// (busy time at the full write rate) while reads of readNs (at the full read
// rate) run beside it and no further read starts: writes get WriteShare while
// those reads drain at ReadShare, the whole device after. With no bound on
// the reads it is writeNs / WriteShare.
func saveNeedNs(m DeviceModel, writeNs, readNs float64) float64 {
	ws := m.WriteShare()
	return min(writeNs/ws, writeNs+(1-ws)*readNs/m.ReadShare())
}

// writeGapNs is what each write adds to a save's time beyond its busy time:
// with at most MaxWritesInFlight writes out, every completion costs the
// device's latency before the next write reaches it.
func (p *Planner) writeGapNs(d *devState) float64 {
	return d.model.LatencyNs() / float64(d.cfg.MaxWritesInFlight)
}

func (d *devState) queuedWrites() int { return len(d.saveQ) - d.saveHead }

// saveTimes returns, for the device's save queue, the latest time it can
// start draining with the reads now in flight beside it (CPU reads and the
// dispatched whole restores' layers not retired) and no read started after (promoteAt: from then on writes are dispatched regardless of slack),
// and the most read work in flight (at the full read rate) that keeps every
// queued write within its deadline less the margin at nowNs (maxReadNs:
// Dispatch starts no read beyond it; +Inf when any amount does, because the
// writes fit at their share beside reads, or reads do not slow writes).
// nowNs matters to maxReadNs only.
func (p *Planner) saveTimes(d *devState, nowNs int64) (promoteAt int64, maxReadNs float64) {
	ws, rs := d.model.WriteShare(), d.model.ReadShare()
	gap := p.writeGapNs(d)
	cum := 0.0
	promoteAt, maxReadNs = math.MaxInt64, math.Inf(1)
	// In-flight writes first (counted whole: conservative), then the queue.
	each := func(i int32) {
		e := &p.entries[i]
		cum += e.svcNs + gap
		end := e.io.DeadlineNs - p.cfg.SlackMarginNs
		promoteAt = min(promoteAt, end-ceilNs(saveNeedNs(d.model, cum, d.inflightReadNs+d.jobReadNs)))
		if ws < 1 && end-ceilNs(cum/ws) <= nowNs {
			// Finishing cum by end needs cum + (1−ws)·r/rs ≤ end − now.
			maxReadNs = min(maxReadNs, (float64(end-nowNs)-cum)*rs/(1-ws))
		}
	}
	for _, i := range d.inflightWr {
		each(i)
	}
	for _, i := range d.saveQ[d.saveHead:] {
		each(i)
	}
	return promoteAt, maxReadNs
}
