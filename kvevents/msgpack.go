package kvevents

import (
	"encoding/binary"
	"fmt"
	"math"
)

// decoder is a bounded msgpack reader. value reads any value into nil,
// bool, int64, uint64 (only above MaxInt64 or from the uint family),
// float64, string, []byte, []any and []mapEntry; the typed readers read one
// value of a family without boxing. Every length is checked against the
// bytes left before anything is allocated.
type decoder struct {
	p   []byte
	off int
}

// mapEntry is one key and value of a decoded map, in wire order.
type mapEntry struct{ k, v any }

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

// peek returns the next type byte without consuming it.
func (d *decoder) peek() (byte, error) {
	if d.off >= len(d.p) {
		return 0, fmt.Errorf("%w: truncated at byte %d", ErrFormat, d.off)
	}
	return d.p[d.off], nil
}

// nilNext consumes a nil and reports whether there was one.
func (d *decoder) nilNext() bool {
	if d.off < len(d.p) && d.p[d.off] == 0xc0 {
		d.off++
		return true
	}
	return false
}

func isArray(t byte) bool { return t&0xf0 == 0x90 || t == 0xdc || t == 0xdd }
func isMap(t byte) bool   { return t&0xf0 == 0x80 || t == 0xde || t == 0xdf }

// arrayLen reads an array header; what names the field in errors. Every
// element takes at least one byte, so a longer claim is rejected.
func (d *decoder) arrayLen(what string, max int) (int, error) {
	t, err := d.peek()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case t&0xf0 == 0x90:
		d.off++
		n = uint64(t & 0x0f)
	case t == 0xdc || t == 0xdd:
		d.off++
		if n, err = d.uintN(2 << (t - 0xdc)); err != nil {
			return 0, err
		}
	default:
		return 0, fmt.Errorf("%w: %s is not an array (type 0x%02x at byte %d)", ErrFormat, what, t, d.off)
	}
	if n > uint64(max) || n > uint64(len(d.p)-d.off) {
		return 0, fmt.Errorf("%w: %s: array of %d elements (at most %d, %d bytes left)", ErrFormat, what, n, max, len(d.p)-d.off)
	}
	return int(n), nil
}

// mapLen reads a map header (every entry takes at least two bytes).
func (d *decoder) mapLen(what string, max int) (int, error) {
	t, err := d.peek()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case t&0xf0 == 0x80:
		d.off++
		n = uint64(t & 0x0f)
	case t == 0xde || t == 0xdf:
		d.off++
		if n, err = d.uintN(2 << (t - 0xde)); err != nil {
			return 0, err
		}
	default:
		return 0, fmt.Errorf("%w: %s is not a map (type 0x%02x at byte %d)", ErrFormat, what, t, d.off)
	}
	if n > uint64(max) || 2*n > uint64(len(d.p)-d.off) {
		return 0, fmt.Errorf("%w: %s: map of %d entries (at most %d, %d bytes left)", ErrFormat, what, n, max, len(d.p)-d.off)
	}
	return int(n), nil
}

// integer reads an int of either family.
func (d *decoder) integer(what string) (int64, uint64, bool, error) {
	t, err := d.peek()
	if err != nil {
		return 0, 0, false, err
	}
	switch {
	case t < 0x80 || (t >= 0xcc && t <= 0xcf):
		v, err := d.value(0)
		u, _ := v.(uint64)
		return 0, u, false, err
	case t >= 0xe0 || (t >= 0xd0 && t <= 0xd3):
		v, err := d.value(0)
		i, _ := v.(int64)
		return i, 0, true, err
	}
	return 0, 0, false, fmt.Errorf("%w: %s is not an int (type 0x%02x at byte %d)", ErrFormat, what, t, d.off)
}

// intIn reads an int in [lo, hi].
func (d *decoder) intIn(what string, lo, hi int64) (int64, error) {
	i, u, signed, err := d.integer(what)
	if err != nil {
		return 0, err
	}
	if !signed {
		if u > math.MaxInt64 {
			return 0, fmt.Errorf("%w: %s = %d, want [%d, %d]", ErrFormat, what, u, lo, hi)
		}
		i = int64(u)
	}
	if i < lo || i > hi {
		return 0, fmt.Errorf("%w: %s = %d, want [%d, %d]", ErrFormat, what, i, lo, hi)
	}
	return i, nil
}

// str reads a string of at most max bytes.
func (d *decoder) str(what string, max int) (string, error) {
	t, err := d.peek()
	if err != nil {
		return "", err
	}
	if t&0xe0 != 0xa0 && (t < 0xd9 || t > 0xdb) {
		return "", fmt.Errorf("%w: %s is not a string (type 0x%02x at byte %d)", ErrFormat, what, t, d.off)
	}
	v, err := d.value(0)
	if err != nil {
		return "", err
	}
	s := v.(string)
	if len(s) > max {
		return "", fmt.Errorf("%w: %s of %d bytes (at most %d)", ErrFormat, what, len(s), max)
	}
	return s, nil
}

// optStr reads a string or nil ("").
func (d *decoder) optStr(what string, max int) (string, error) {
	if d.nilNext() {
		return "", nil
	}
	return d.str(what, max)
}

// raw reads one value and returns a copy of its encoding.
func (d *decoder) raw(depth, max int) (RawValue, error) {
	start := d.off
	if _, err := d.value(depth); err != nil {
		return nil, err
	}
	if d.off-start > max {
		return nil, fmt.Errorf("%w: a value of %d bytes (at most %d)", ErrFormat, d.off-start, max)
	}
	return append(RawValue(nil), d.p[start:d.off]...), nil
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
	case isMap(t):
		d.off--
		return d.mapValue(depth)
	case isArray(t):
		d.off--
		return d.array(depth)
	case t&0xe0 == 0xa0:
		return d.strBytes(int(t & 0x1f))
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
		return d.strBytes(int(min(n, math.MaxInt32)))
	}
	return nil, fmt.Errorf("%w: msgpack type 0x%02x at byte %d", ErrFormat, t, d.off-1)
}

func (d *decoder) strBytes(n int) (any, error) {
	if n > maxStringBytes {
		return nil, fmt.Errorf("%w: string of %d bytes", ErrFormat, n)
	}
	b, err := d.take(n)
	return string(b), err
}

func (d *decoder) array(depth int) (any, error) {
	n, err := d.arrayLen("array", MaxEventTokens)
	if err != nil {
		return nil, err
	}
	a := make([]any, n)
	for i := range a {
		if a[i], err = d.value(depth + 1); err != nil {
			return nil, err
		}
	}
	return a, nil
}

func (d *decoder) mapValue(depth int) (any, error) {
	n, err := d.mapLen("map", MaxEventTokens)
	if err != nil {
		return nil, err
	}
	m := make([]mapEntry, n)
	for i := range m {
		if m[i].k, err = d.value(depth + 1); err != nil {
			return nil, err
		}
		if m[i].v, err = d.value(depth + 1); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// seqBytes is a sequence number as vLLM writes it.
func seqBytes(seq int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(seq)) }
