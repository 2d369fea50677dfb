// Package nodewire is the wire protocol between a node's store service
// (tutti serve) and the engines connected to it: the control path of a
// store (index, allocation, commit, eviction) as requests and responses on
// a unix stream socket. The data path is not on the wire: an engine reads
// and writes the pool files itself.
//
// A frame is a little-endian u32 body length (at most MaxFrameBytes) and
// the body: u8 op, u64 request id, then the op's payload. A response
// echoes op and id and carries an error code and message before its
// payload. The first request of a connection is OpHello, which carries
// Version; a service refuses any other version. Every count in a payload
// is bounded by the bytes left in its frame and by MaxItems, so a hostile
// or torn frame is an error, never a panic or a large allocation
// (FuzzDecode).
package nodewire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// Version is the protocol version; it changes with any frame or payload.
//
//	1: the first.
//	2: HelloResp carries the store's layout (FilesPerDir, RunWidth).
const Version = 2

// MaxFrameBytes bounds a frame's body (a pin's runs with their chunk CRC
// tables are the largest).
const MaxFrameBytes = 16 << 20

// MaxItems bounds any list in a payload (chain ids, CRCs, runs).
const MaxItems = 1 << 20

// ErrProtocol is wrapped by every error about a malformed frame or payload.
var ErrProtocol = errors.New("nodewire: protocol error")

// Op is a request's kind.
type Op uint8

const (
	OpHello Op = iota + 1
	OpLookup
	OpPin
	OpUnpin
	OpCorrupt
	OpDiscard
	OpResident
	OpReserve
	OpAllocate
	OpAllocateOne
	OpAbort
	OpUnreserve
	OpCommit
	OpJournalReady
	opEnd
)

// Valid reports whether o is a known op.
func (o Op) Valid() bool { return o >= OpHello && o < opEnd }

// Enc appends a payload.
type Enc struct{ B []byte }

func (e *Enc) U8(v uint8)   { e.B = append(e.B, v) }
func (e *Enc) U16(v uint16) { e.B = binary.LittleEndian.AppendUint16(e.B, v) }
func (e *Enc) U32(v uint32) { e.B = binary.LittleEndian.AppendUint32(e.B, v) }
func (e *Enc) U64(v uint64) { e.B = binary.LittleEndian.AppendUint64(e.B, v) }
func (e *Enc) Int(v int)    { e.U64(uint64(int64(v))) }
func (e *Enc) Bool(v bool) {
	if v {
		e.U8(1)
	} else {
		e.U8(0)
	}
}
func (e *Enc) Bytes(b []byte) { e.U32(uint32(len(b))); e.B = append(e.B, b...) }
func (e *Enc) Str(s string)   { e.U32(uint32(len(s))); e.B = append(e.B, s...) }
func (e *Enc) U64s(v []uint64) {
	e.U32(uint32(len(v)))
	for _, x := range v {
		e.U64(x)
	}
}
func (e *Enc) U32s(v []uint32) {
	e.U32(uint32(len(v)))
	for _, x := range v {
		e.U32(x)
	}
}

// Dec reads a payload; the first error sticks (Err), later reads return
// zeros.
type Dec struct {
	B   []byte
	err error
}

// Err is the first error, nil when every read fit.
func (d *Dec) Err() error { return d.err }

// Fail records err unless an error is recorded already.
func (d *Dec) Fail(format string, a ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrProtocol, fmt.Sprintf(format, a...))
	}
}

// Done fails unless every byte was read.
func (d *Dec) Done() error {
	if d.err == nil && len(d.B) != 0 {
		d.Fail("%d trailing bytes", len(d.B))
	}
	return d.err
}

func (d *Dec) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.B) {
		d.Fail("%d bytes wanted, %d left", n, len(d.B))
		return nil
	}
	b := d.B[:n]
	d.B = d.B[n:]
	return b
}

func (d *Dec) U8() uint8 {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}
func (d *Dec) U16() uint16 {
	if b := d.take(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}
func (d *Dec) U32() uint32 {
	if b := d.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}
func (d *Dec) U64() uint64 {
	if b := d.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// Int reads a non-negative int of at most max.
func (d *Dec) Int(max int) int {
	v := int64(d.U64())
	if v < 0 || v > int64(max) {
		d.Fail("value %d out of range [0, %d]", v, max)
		return 0
	}
	return int(v)
}

// I64 reads a non-negative int64.
func (d *Dec) I64() int64 { return int64(d.Int(math.MaxInt64)) }

func (d *Dec) Bool() bool {
	switch d.U8() {
	case 0:
		return false
	case 1:
		return true
	}
	d.Fail("bool not 0 or 1")
	return false
}

// count reads a list length whose items take at least size bytes each.
func (d *Dec) count(size int) int {
	n := int(d.U32())
	if d.err == nil && (n > MaxItems || n*size > len(d.B)) {
		d.Fail("list of %d items of %d bytes, %d bytes left (at most %d items)", n, size, len(d.B), MaxItems)
		return 0
	}
	return n
}

// Count reads the length of a list whose items take at least size bytes.
func (d *Dec) Count(size int) int { return d.count(size) }

func (d *Dec) Bytes() []byte {
	n := d.count(1)
	if b := d.take(n); b != nil {
		return append([]byte(nil), b...)
	}
	return nil
}
func (d *Dec) Str() string { return string(d.Bytes()) }
func (d *Dec) U64s() []uint64 {
	n := d.count(8)
	if d.err != nil || n == 0 {
		return nil
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = d.U64()
	}
	return out
}
func (d *Dec) U32s() []uint32 {
	n := d.count(4)
	if d.err != nil || n == 0 {
		return nil
	}
	out := make([]uint32, n)
	for i := range out {
		out[i] = d.U32()
	}
	return out
}

// Frame is one decoded frame: its op, request id and payload (the rest of
// the body).
type Frame struct {
	Op      Op
	ID      uint64
	Payload []byte
}

// frameHeadBytes is a body's op and id.
const frameHeadBytes = 9

// AppendFrame appends a frame of op and id around payload to dst.
func AppendFrame(dst []byte, op Op, id uint64, payload []byte) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(frameHeadBytes+len(payload)))
	dst = append(dst, byte(op))
	dst = binary.LittleEndian.AppendUint64(dst, id)
	return append(dst, payload...)
}

// ReadFrame reads one frame from r into buf (grown as needed, returned for
// reuse); the frame's payload aliases buf. io.EOF only before a frame's
// first byte.
func ReadFrame(r io.Reader, buf []byte) (Frame, []byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Frame{}, buf, err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if n < frameHeadBytes || n > MaxFrameBytes {
		return Frame{}, buf, fmt.Errorf("%w: frame of %d bytes, want [%d, %d]", ErrProtocol, n, frameHeadBytes, MaxFrameBytes)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, buf, err
	}
	f, err := ParseBody(buf)
	return f, buf, err
}

// ParseBody splits a frame's body (after its length) into op, id and
// payload.
func ParseBody(b []byte) (Frame, error) {
	if len(b) < frameHeadBytes {
		return Frame{}, fmt.Errorf("%w: body of %d bytes", ErrProtocol, len(b))
	}
	f := Frame{Op: Op(b[0]), ID: binary.LittleEndian.Uint64(b[1:9]), Payload: b[9:]}
	if !f.Op.Valid() {
		return Frame{}, fmt.Errorf("%w: unknown op %d", ErrProtocol, b[0])
	}
	return f, nil
}
