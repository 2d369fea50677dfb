package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrFormat is wrapped by every DecodeBatch error.
var ErrFormat = errors.New("kvevents: malformed batch")

// DecodeBatch parses one batch payload (what AppendBatch writes, or what
// vLLM v0.11.0 publishes: a batch without data_parallel_rank decodes with
// rank -1). It rejects trailing bytes, unknown tags, wrong field counts and
// anything past the Max* limits, naming what is wrong.
func DecodeBatch(p []byte) (Batch, error) {
	d := decoder{p: p}
	v, err := d.value(0)
	if err != nil {
		return Batch{}, err
	}
	if d.off != len(p) {
		return Batch{}, fmt.Errorf("%w: %d trailing bytes", ErrFormat, len(p)-d.off)
	}
	arr, ok := v.([]any)
	if !ok || len(arr) < 2 || len(arr) > 3 {
		return Batch{}, fmt.Errorf("%w: batch is not an array of 2 or 3 fields", ErrFormat)
	}
	var b Batch
	switch ts := arr[0].(type) {
	case float64:
		b.TS = ts
	case int64:
		b.TS = float64(ts)
	case uint64:
		b.TS = float64(ts)
	default:
		return Batch{}, fmt.Errorf("%w: ts is %T", ErrFormat, arr[0])
	}
	evs, ok := arr[1].([]any)
	if !ok {
		return Batch{}, fmt.Errorf("%w: events is %T", ErrFormat, arr[1])
	}
	b.DataParallelRank = -1
	if len(arr) == 3 && arr[2] != nil {
		r, ok := asInt(arr[2])
		if !ok {
			return Batch{}, fmt.Errorf("%w: data_parallel_rank is %T", ErrFormat, arr[2])
		}
		b.DataParallelRank = int(r)
	}
	b.Events = make([]Event, 0, len(evs))
	for i, ev := range evs {
		e, err := decodeEvent(ev)
		if err != nil {
			return Batch{}, fmt.Errorf("event %d: %w", i, err)
		}
		b.Events = append(b.Events, e)
	}
	return b, nil
}

func decodeEvent(v any) (Event, error) {
	f, ok := v.([]any)
	if !ok || len(f) == 0 {
		return Event{}, fmt.Errorf("%w: event is not a tagged array", ErrFormat)
	}
	tag, _ := f[0].(string)
	var e Event
	switch tag {
	case "BlockStored":
		if len(f) != 7 {
			return Event{}, fmt.Errorf("%w: BlockStored has %d fields, want 7", ErrFormat, len(f))
		}
		e.Kind = BlockStored
		var err error
		if e.Hashes, err = decodeHashes(f[1]); err != nil {
			return Event{}, err
		}
		if f[2] != nil {
			if e.Parent, err = decodeHash(f[2]); err != nil {
				return Event{}, err
			}
			e.HasParent = true
		}
		toks, ok := f[3].([]any)
		if !ok {
			return Event{}, fmt.Errorf("%w: token_ids is %T", ErrFormat, f[3])
		}
		e.Tokens = make([]uint32, len(toks))
		for i, t := range toks {
			u, ok := asInt(t)
			if !ok || u < 0 || u > math.MaxUint32 {
				return Event{}, fmt.Errorf("%w: token_ids[%d] is not a uint32", ErrFormat, i)
			}
			e.Tokens[i] = uint32(u)
		}
		bs, ok := asInt(f[4])
		if !ok || bs <= 0 || bs > math.MaxInt32 {
			return Event{}, fmt.Errorf("%w: block_size %v", ErrFormat, f[4])
		}
		e.BlockSize = int(bs)
		if len(e.Tokens) != 0 && len(e.Tokens) != len(e.Hashes)*e.BlockSize {
			return Event{}, fmt.Errorf("%w: %d token ids for %d blocks of %d", ErrFormat, len(e.Tokens), len(e.Hashes), e.BlockSize)
		}
		if e.Medium, err = decodeMedium(f[6]); err != nil {
			return Event{}, err
		}
	case "BlockRemoved":
		if len(f) != 3 {
			return Event{}, fmt.Errorf("%w: BlockRemoved has %d fields, want 3", ErrFormat, len(f))
		}
		e.Kind = BlockRemoved
		var err error
		if e.Hashes, err = decodeHashes(f[1]); err != nil {
			return Event{}, err
		}
		if e.Medium, err = decodeMedium(f[2]); err != nil {
			return Event{}, err
		}
	case "AllBlocksCleared":
		if len(f) != 1 {
			return Event{}, fmt.Errorf("%w: AllBlocksCleared has %d fields, want 1", ErrFormat, len(f))
		}
		e.Kind = AllBlocksCleared
	default:
		return Event{}, fmt.Errorf("%w: unknown event tag %q", ErrFormat, tag)
	}
	return e, nil
}

func decodeMedium(v any) (string, error) {
	if v == nil {
		return "", nil
	}
	s, ok := v.(string)
	if !ok || len(s) > maxMediumBytes {
		return "", fmt.Errorf("%w: medium %v", ErrFormat, v)
	}
	return s, nil
}

func decodeHashes(v any) ([]Hash, error) {
	a, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: block_hashes is %T", ErrFormat, v)
	}
	hs := make([]Hash, len(a))
	for i, x := range a {
		h, err := decodeHash(x)
		if err != nil {
			return nil, fmt.Errorf("block_hashes[%d]: %w", i, err)
		}
		hs[i] = h
	}
	return hs, nil
}

func decodeHash(v any) (Hash, error) {
	switch h := v.(type) {
	case []byte:
		if len(h) == 0 || len(h) > MaxHashBytes {
			return Hash{}, fmt.Errorf("%w: %d hash bytes", ErrFormat, len(h))
		}
		return Hash{bytes: h}, nil
	case uint64:
		return IntHash(h), nil
	case int64:
		return IntHash(uint64(h)), nil // vLLM may send a negative Python hash()
	}
	return Hash{}, fmt.Errorf("%w: hash is %T", ErrFormat, v)
}

func asInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case uint64:
		if x > math.MaxInt64 {
			return 0, false
		}
		return int64(x), true
	}
	return 0, false
}

// decoder reads msgpack values into nil, bool, int64, uint64 (only above
// MaxInt64 or from the uint family), float64, string, []byte and []any.
// Maps and extensions are rejected: vLLM's batches have none.
type decoder struct {
	p   []byte
	off int
}

func (d *decoder) take(n int) ([]byte, error) {
	if n < 0 || len(d.p)-d.off < n {
		return nil, fmt.Errorf("%w: truncated at byte %d", ErrFormat, d.off)
	}
	b := d.p[d.off : d.off+n]
	d.off += n
	return b, nil
}

func (d *decoder) uintN(n int) (uint64, error) {
	b, err := d.take(n)
	if err != nil {
		return 0, err
	}
	var u uint64
	for _, c := range b {
		u = u<<8 | uint64(c)
	}
	return u, nil
}

func (d *decoder) value(depth int) (any, error) {
	if depth > maxDecodeDepth {
		return nil, fmt.Errorf("%w: nested deeper than %d", ErrFormat, maxDecodeDepth)
	}
	tb, err := d.take(1)
	if err != nil {
		return nil, err
	}
	t := tb[0]
	switch {
	case t < 0x80:
		return uint64(t), nil
	case t >= 0xe0:
		return int64(int8(t)), nil
	case t&0xf0 == 0x90:
		return d.array(int(t&0x0f), depth)
	case t&0xe0 == 0xa0:
		return d.str(int(t & 0x1f))
	}
	switch t {
	case 0xc0:
		return nil, nil
	case 0xc2:
		return false, nil
	case 0xc3:
		return true, nil
	case 0xc4, 0xc5, 0xc6:
		n, err := d.uintN(1 << (t - 0xc4))
		if err != nil {
			return nil, err
		}
		if n > maxStringBytes {
			return nil, fmt.Errorf("%w: bin of %d bytes", ErrFormat, n)
		}
		b, err := d.take(int(n))
		return append([]byte(nil), b...), err
	case 0xca:
		u, err := d.uintN(4)
		return float64(math.Float32frombits(uint32(u))), err
	case 0xcb:
		u, err := d.uintN(8)
		return math.Float64frombits(u), err
	case 0xcc, 0xcd, 0xce, 0xcf:
		return d.uintN(1 << (t - 0xcc))
	case 0xd0, 0xd1, 0xd2, 0xd3:
		n := 1 << (t - 0xd0)
		u, err := d.uintN(n)
		shift := 64 - 8*n
		return int64(u<<shift) >> shift, err
	case 0xd9, 0xda, 0xdb:
		n, err := d.uintN(1 << (t - 0xd9))
		if err != nil {
			return nil, err
		}
		return d.str(int(min(n, math.MaxInt32)))
	case 0xdc, 0xdd:
		n, err := d.uintN(2 << (t - 0xdc))
		if err != nil {
			return nil, err
		}
		return d.array(int(min(n, math.MaxInt32)), depth)
	}
	return nil, fmt.Errorf("%w: msgpack type 0x%02x at byte %d", ErrFormat, t, d.off-1)
}

func (d *decoder) str(n int) (any, error) {
	if n > maxStringBytes {
		return nil, fmt.Errorf("%w: string of %d bytes", ErrFormat, n)
	}
	b, err := d.take(n)
	return string(b), err
}

func (d *decoder) array(n, depth int) (any, error) {
	if n > MaxEventTokens {
		return nil, fmt.Errorf("%w: array of %d elements", ErrFormat, n)
	}
	// Every element takes at least one byte: a claimed length beyond the
	// remaining input is rejected before allocating.
	if n > len(d.p)-d.off {
		return nil, fmt.Errorf("%w: array of %d elements in %d bytes", ErrFormat, n, len(d.p)-d.off)
	}
	a := make([]any, n)
	for i := range a {
		v, err := d.value(depth + 1)
		if err != nil {
			return nil, err
		}
		a[i] = v
	}
	return a, nil
}

// seqBytes is a sequence number as vLLM writes it.
func seqBytes(seq int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(seq)) }
