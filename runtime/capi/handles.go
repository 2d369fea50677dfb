package main

import (
	"sync"
)

// kind tags a handle so that a load handle passed where a store is expected
// is refused instead of misused. The kind is the handle's top byte.
type kind uint8

const (
	kindStore kind = 1
	kindLoad  kind = 2
	kindSave  kind = 3
	kindHold  kind = 4
)

func (k kind) String() string {
	switch k {
	case kindStore:
		return "store"
	case kindLoad:
		return "load"
	case kindSave:
		return "save"
	case kindHold:
		return "hold"
	}
	return "unknown"
}

const (
	kindShift = 56
	seqMask   = 1<<kindShift - 1
	// maxHandles bounds the live handles of all kinds together, so a caller
	// that never releases cannot grow the table without limit.
	maxHandles = 1 << 20
)

// table maps handles to Go objects. Handles are never reused: the sequence
// only grows (2^56 handles before it would wrap), so a stale handle can not
// name a newer object.
type table struct {
	mu   sync.Mutex
	next uint64
	live map[uint64]any
}

func newTable() *table { return &table{live: make(map[uint64]any)} }

// add stores v under a fresh handle of kind k.
func (t *table) add(k kind, v any) (uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.live) >= maxHandles {
		return 0, errorf(errBusy, "%d handles are live (limit %d): release loads and saves", len(t.live), maxHandles)
	}
	t.next++
	h := uint64(k)<<kindShift | t.next&seqMask
	t.live[h] = v
	return h, nil
}

// get returns the object behind h if h is live and of kind k.
func (t *table) get(h uint64, k kind) (any, error) {
	if err := checkKind(h, k); err != nil {
		return nil, err
	}
	t.mu.Lock()
	v, ok := t.live[h]
	t.mu.Unlock()
	if !ok {
		return nil, errorf(errBadHandle, "%s handle %#x is not live (released, closed, or never issued)", k, h)
	}
	return v, nil
}

// take removes h (of kind k) and returns its object; a second take of the
// same handle fails, so exactly one caller owns the teardown.
func (t *table) take(h uint64, k kind) (any, error) {
	if err := checkKind(h, k); err != nil {
		return nil, err
	}
	t.mu.Lock()
	v, ok := t.live[h]
	delete(t.live, h)
	t.mu.Unlock()
	if !ok {
		return nil, errorf(errBadHandle, "%s handle %#x is not live (released, closed, or never issued)", k, h)
	}
	return v, nil
}

func (t *table) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.live)
}

func checkKind(h uint64, k kind) error {
	if h == 0 {
		return errorf(errBadHandle, "%s handle is 0 (never valid)", k)
	}
	if got := kind(h >> kindShift); got != k {
		return errorf(errBadHandle, "handle %#x is a %s handle, not a %s handle", h, got, k)
	}
	return nil
}
