package staging

import "testing"

// TestPool: the pool has totalBytes/slotBytes slots, each with its ID and
// memory; TryAcquire says when none is free; a released slot comes back.
func TestPool(t *testing.T) {
	p, err := New(4<<12, 1<<12)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Slots()) != 4 || p.SlotBytes != 1<<12 {
		t.Fatalf("%d slots of %d bytes", len(p.Slots()), p.SlotBytes)
	}
	var held []*Slot
	for range 4 {
		s := p.TryAcquire()
		if s == nil || len(s.Data) != 1<<12 || p.Slots()[s.ID] != s || s.Req.Owner != s {
			t.Fatalf("slot %+v", s)
		}
		held = append(held, s)
	}
	if p.TryAcquire() != nil {
		t.Fatal("a fifth slot of four")
	}
	sink := make(chan *Slot, 1)
	held[0].Sink = sink
	held[0].IODone(&held[0].Req)
	if <-sink != held[0] {
		t.Fatal("IODone did not send the slot on its sink")
	}
	p.Release(held[0])
	if p.Acquire() != held[0] {
		t.Fatal("the released slot did not come back")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}
