package kvevents

import (
	"errors"
	"fmt"
	"math"
)

// ErrFormat is wrapped by every DecodeBatch and DecodeEvents error.
var ErrFormat = errors.New("kvevents: malformed batch")

// DecodeBatch parses one batch payload: what AppendBatch writes in either
// Format, or what vLLM 0.11 or 0.26 publishes (a batch without
// data_parallel_rank decodes with rank -1). The events' layout is detected
// and returned in Batch.Format; a batch that mixes layouts is rejected. Map
// events are read as msgspec reads them: unknown fields are skipped, a
// missing required field is an error; lora_id and the kv_cache_spec fields
// are read and dropped (tutti publishes them as None). Trailing bytes,
// unknown tags, wrong field counts and anything past the Max* limits are
// errors naming what is wrong.
func DecodeBatch(p []byte) (Batch, error) {
	d := decoder{p: p}
	n, err := d.arrayLen("batch", 3)
	if err != nil {
		return Batch{}, err
	}
	if n < 2 {
		return Batch{}, fmt.Errorf("%w: batch is not an array of 2 or 3 fields", ErrFormat)
	}
	var b Batch
	ts, err := d.value(1)
	if err != nil {
		return Batch{}, err
	}
	switch ts := ts.(type) {
	case float64:
		b.TS = ts
	case int64:
		b.TS = float64(ts)
	case uint64:
		b.TS = float64(ts)
	default:
		return Batch{}, fmt.Errorf("%w: ts is %T", ErrFormat, ts)
	}
	if b.Events, b.Format, err = d.events(1); err != nil {
		return Batch{}, err
	}
	b.DataParallelRank = -1
	if n == 3 && !d.nilNext() {
		r, err := d.intIn("data_parallel_rank", 0, math.MaxInt32)
		if err != nil {
			return Batch{}, err
		}
		b.DataParallelRank = int(r)
	}
	if d.off != len(p) {
		return Batch{}, fmt.Errorf("%w: %d trailing bytes", ErrFormat, len(p)-d.off)
	}
	return b, nil
}

// DecodeEvents parses what AppendEvents writes: one array of events (the
// form an engine takes them in, Publisher.Take).
func DecodeEvents(p []byte) ([]Event, Format, error) {
	d := decoder{p: p}
	evs, f, err := d.events(0)
	if err == nil && d.off != len(p) {
		err = fmt.Errorf("%w: %d trailing bytes", ErrFormat, len(p)-d.off)
	}
	return evs, f, err
}

// events reads an array of events, all of one layout.
func (d *decoder) events(depth int) ([]Event, Format, error) {
	n, err := d.arrayLen("events", MaxBatchEvents)
	if err != nil {
		return nil, 0, err
	}
	var f Format
	evs := make([]Event, n)
	for i := range evs {
		t, err := d.peek()
		if err != nil {
			return nil, 0, err
		}
		ef := FormatVLLM026
		if isArray(t) {
			ef = FormatVLLM011
		}
		if i == 0 {
			f = ef
		} else if ef != f {
			return nil, 0, fmt.Errorf("%w: event %d is %v, the first was %v", ErrFormat, i, ef, f)
		}
		if ef == FormatVLLM011 {
			err = d.eventArray(&evs[i], depth+1)
		} else {
			err = d.eventMap(&evs[i], depth+1)
		}
		if err != nil {
			return nil, 0, fmt.Errorf("event %d: %w", i, err)
		}
	}
	return evs, f, nil
}

// The fields of vLLM 0.26's events, as bits of what a map held.
const (
	fType = 1 << iota
	fHashes
	fParent
	fTokens
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fGroupIdx
	fSpecKind
	fSpecWindow
	fLocality
)

// fieldNames[i] is the field of bit 1<<i.
var fieldNames = [...]string{"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
	"medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "locality"}

var mapFields = func() map[string]int {
	m := make(map[string]int, len(fieldNames))
	for i, n := range fieldNames {
		m[n] = 1 << i
	}
	return m
}()

// The fields without a default in vLLM 0.26's structs: msgspec requires them.
const (
	storedRequired  = fHashes | fParent | fTokens | fBlockSize | fLoRAID | fMedium | fLoRAName
	removedRequired = fHashes | fMedium
)

// eventMap reads one vLLM 0.26 event (a map tagged by "type").
func (d *decoder) eventMap(e *Event, depth int) error {
	n, err := d.mapLen("event", maxMapFields)
	if err != nil {
		return err
	}
	var seen int
	var tag string
	for range n {
		k, err := d.str("field name", maxStringBytes)
		if err != nil {
			return err
		}
		bit, known := mapFields[k]
		if !known { // msgspec skips fields it does not know
			if _, err := d.value(depth + 1); err != nil {
				return err
			}
			continue
		}
		if seen&bit != 0 {
			return fmt.Errorf("%w: field %q twice", ErrFormat, k)
		}
		seen |= bit
		if err := d.field(e, bit, &tag, depth+1); err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
	}
	var required int
	switch tag {
	case "BlockStored":
		e.Kind, required = BlockStored, storedRequired
	case "BlockRemoved":
		e.Kind, required = BlockRemoved, removedRequired
		*e = Event{Kind: BlockRemoved, Hashes: e.Hashes, Medium: e.Medium, GroupIdx: e.GroupIdx, HasGroupIdx: e.HasGroupIdx, Locality: e.Locality}
	case "AllBlocksCleared":
		*e = Event{Kind: AllBlocksCleared}
	default:
		return fmt.Errorf("%w: unknown event tag %q", ErrFormat, tag)
	}
	if missing := required &^ seen; missing != 0 {
		for i, name := range fieldNames {
			if missing&(1<<i) != 0 {
				return fmt.Errorf("%w: %s without %q", ErrFormat, tag, name)
			}
		}
	}
	if e.Kind == BlockStored {
		return e.checkStored()
	}
	return nil
}

// field reads the value of one known map field into e.
func (d *decoder) field(e *Event, bit int, tag *string, depth int) error {
	var err error
	switch bit {
	case fType:
		*tag, err = d.str("type", maxStringBytes)
	case fHashes:
		e.Hashes, err = d.hashes()
	case fParent:
		e.HasParent = !d.nilNext()
		if e.HasParent {
			e.Parent, err = d.hash()
		}
	case fTokens:
		e.Tokens, err = d.tokens()
	case fBlockSize:
		var bs int64
		bs, err = d.intIn("block_size", 0, math.MaxInt32)
		e.BlockSize = int(bs)
	case fLoRAID, fSpecWindow:
		if !d.nilNext() {
			_, err = d.intIn("int field", math.MinInt64, math.MaxInt64)
		}
	case fMedium:
		e.Medium, err = d.optStr("medium", maxMediumBytes)
	case fLoRAName:
		e.LoRAName, err = d.optStr("lora_name", maxStringBytes)
	case fSpecKind:
		_, err = d.optStr("kv_cache_spec_kind", maxStringBytes)
	case fLocality:
		e.Locality, err = d.optStr("locality", maxMediumBytes)
	case fGroupIdx:
		e.HasGroupIdx = !d.nilNext()
		if e.HasGroupIdx {
			var g int64
			g, err = d.intIn("group_idx", 0, math.MaxInt32)
			e.GroupIdx = int(g)
		}
	case fExtraKeys:
		if d.nilNext() {
			return nil
		}
		var n int
		if n, err = d.arrayLen("extra_keys", MaxEventHashes); err != nil {
			return err
		}
		e.ExtraKeys = make([]RawValue, n)
		for i := range e.ExtraKeys {
			if d.nilNext() {
				continue
			}
			if e.ExtraKeys[i], err = d.raw(depth+1, MaxExtraBytes); err != nil {
				return err
			}
		}
	}
	return err
}

// checkStored checks what a BlockStored's fields say of each other.
func (e *Event) checkStored() error {
	if len(e.Tokens) != 0 && (e.BlockSize == 0 || len(e.Tokens) != len(e.Hashes)*e.BlockSize) {
		return fmt.Errorf("%w: %d token ids for %d blocks of %d", ErrFormat, len(e.Tokens), len(e.Hashes), e.BlockSize)
	}
	if e.ExtraKeys != nil && len(e.ExtraKeys) != len(e.Hashes) {
		return fmt.Errorf("%w: %d extra_keys entries for %d blocks", ErrFormat, len(e.ExtraKeys), len(e.Hashes))
	}
	return nil
}

// eventArray reads one vLLM 0.11 event (an array, the tag first).
func (d *decoder) eventArray(e *Event, depth int) error {
	n, err := d.arrayLen("event", 7)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%w: event is an empty array", ErrFormat)
	}
	tag, err := d.str("tag", maxStringBytes)
	if err != nil {
		return err
	}
	want := map[string]int{"BlockStored": 7, "BlockRemoved": 3, "AllBlocksCleared": 1}[tag]
	if want == 0 {
		return fmt.Errorf("%w: unknown event tag %q", ErrFormat, tag)
	}
	if n != want {
		return fmt.Errorf("%w: %s has %d fields, want %d", ErrFormat, tag, n, want)
	}
	switch tag {
	case "AllBlocksCleared":
		e.Kind = AllBlocksCleared
		return nil
	case "BlockRemoved":
		e.Kind = BlockRemoved
		if e.Hashes, err = d.hashes(); err != nil {
			return err
		}
		e.Medium, err = d.optStr("medium", maxMediumBytes)
		return err
	}
	e.Kind = BlockStored
	var tag2 string
	for _, bit := range []int{fHashes, fParent, fTokens, fBlockSize, fLoRAID, fMedium} {
		if err := d.field(e, bit, &tag2, depth+1); err != nil {
			return err
		}
	}
	return e.checkStored()
}

func (d *decoder) hashes() ([]Hash, error) {
	n, err := d.arrayLen("block_hashes", MaxEventHashes)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	hs := make([]Hash, n)
	for i := range hs {
		if hs[i], err = d.hash(); err != nil {
			return nil, fmt.Errorf("block_hashes[%d]: %w", i, err)
		}
	}
	return hs, nil
}

func (d *decoder) hash() (Hash, error) {
	t, err := d.peek()
	if err != nil {
		return Hash{}, err
	}
	if t >= 0xc4 && t <= 0xc6 {
		v, err := d.value(0)
		if err != nil {
			return Hash{}, err
		}
		b := v.([]byte)
		if len(b) == 0 || len(b) > MaxHashBytes {
			return Hash{}, fmt.Errorf("%w: %d hash bytes", ErrFormat, len(b))
		}
		return Hash{bytes: b}, nil
	}
	i, u, signed, err := d.integer("hash")
	if err != nil {
		return Hash{}, err
	}
	if signed {
		return IntHash(uint64(i)), nil // vLLM may send a negative Python hash()
	}
	return IntHash(u), nil
}

func (d *decoder) tokens() ([]uint32, error) {
	n, err := d.arrayLen("token_ids", MaxEventTokens)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	toks := make([]uint32, n)
	for i := range toks {
		t, err := d.intIn("token id", 0, math.MaxUint32)
		if err != nil {
			return nil, fmt.Errorf("token_ids[%d]: %w", i, err)
		}
		toks[i] = uint32(t)
	}
	return toks, nil
}
