package kvevents

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Kind is an event's type.
type Kind uint8

// The event kinds of vLLM v0.11.0's KV event stream.
const (
	BlockStored Kind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

// Tag is the msgspec tag vLLM writes for k (its class name).
func (k Kind) Tag() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// MediumDisk is the medium tutti publishes: Dynamo and llm-d count it as
// their disk tier.
const MediumDisk = "DISK"

// Hash is an ExternalBlockHash: an unsigned int or raw bytes (vLLM's own
// hash bytes when the engine gave them). The zero value is the int 0.
type Hash struct {
	bytes []byte
	u     uint64
}

// IntHash is a hash published as a msgpack int.
func IntHash(u uint64) Hash { return Hash{u: u} }

// BytesHash is a hash published as msgpack bin; b is copied. Empty b is
// published as the int 0 (vLLM never sends empty hash bytes).
func BytesHash(b []byte) Hash {
	if len(b) == 0 {
		return Hash{}
	}
	return Hash{bytes: append([]byte(nil), b...)}
}

// Bytes returns the raw hash bytes, nil for an int hash.
func (h Hash) Bytes() []byte { return h.bytes }

// Uint returns the int hash; for a bytes hash, its last 8 bytes big-endian
// (vLLM's and llm-d's fold), left-padded with zeros when shorter.
func (h Hash) Uint() uint64 {
	if h.bytes == nil {
		return h.u
	}
	b := h.bytes
	if len(b) > 8 {
		b = b[len(b)-8:]
	}
	var u uint64
	for _, c := range b {
		u = u<<8 | uint64(c)
	}
	return u
}

// Key is a comparable form of h (map keys in consumers).
func (h Hash) Key() string {
	if h.bytes == nil {
		var b [9]byte
		binary.BigEndian.PutUint64(b[1:], h.u)
		return string(b[:])
	}
	return "b" + string(h.bytes)
}

func (h Hash) String() string {
	if h.bytes == nil {
		return fmt.Sprintf("%#x", h.u)
	}
	return fmt.Sprintf("bytes:%x", h.bytes)
}

// Event is one KV event. BlockStored uses every field (Parent only when
// HasParent); BlockRemoved uses Hashes and Medium; AllBlocksCleared none.
// LoRA ids are always nil: tutti keys KV by chain id only.
type Event struct {
	Kind      Kind
	Hashes    []Hash
	Parent    Hash
	HasParent bool
	// Tokens are the token ids of the stored blocks, BlockSize per block,
	// in order; empty when the store does not know them (hashes only).
	Tokens    []uint32
	BlockSize int
	Medium    string
}

// Batch is one published message's payload.
type Batch struct {
	TS               float64
	Events           []Event
	DataParallelRank int
}

// Limits on what one encoded batch may hold (the decoder enforces them too).
const (
	MaxBatchEvents = 1 << 16
	MaxEventHashes = 1 << 16
	MaxEventTokens = 1 << 22
	MaxHashBytes   = 64
	maxMediumBytes = 64
	maxStringBytes = 1 << 10
	maxDecodeDepth = 8
)

// AppendBatch appends b's msgpack encoding (vLLM v0.11.0 KVEventBatch) to dst.
func AppendBatch(dst []byte, b *Batch) []byte {
	dst = appendArray(dst, 3)
	dst = appendFloat64(dst, b.TS)
	dst = appendArray(dst, len(b.Events))
	for i := range b.Events {
		dst = AppendEvent(dst, &b.Events[i])
	}
	return appendInt(dst, int64(b.DataParallelRank))
}

// AppendEvent appends one event as vLLM's tagged array-like struct.
func AppendEvent(dst []byte, e *Event) []byte {
	switch e.Kind {
	case BlockStored:
		dst = appendArray(dst, 7)
		dst = appendStr(dst, e.Kind.Tag())
		dst = appendHashes(dst, e.Hashes)
		if e.HasParent {
			dst = appendHash(dst, e.Parent)
		} else {
			dst = append(dst, 0xc0)
		}
		dst = appendArray(dst, len(e.Tokens))
		for _, t := range e.Tokens {
			dst = appendUint(dst, uint64(t))
		}
		dst = appendInt(dst, int64(e.BlockSize))
		dst = append(dst, 0xc0) // lora_id
		return appendStr(dst, e.Medium)
	case BlockRemoved:
		dst = appendArray(dst, 3)
		dst = appendStr(dst, e.Kind.Tag())
		dst = appendHashes(dst, e.Hashes)
		return appendStr(dst, e.Medium)
	default:
		dst = appendArray(dst, 1)
		return appendStr(dst, AllBlocksCleared.Tag())
	}
}

func appendHashes(dst []byte, hs []Hash) []byte {
	dst = appendArray(dst, len(hs))
	for _, h := range hs {
		dst = appendHash(dst, h)
	}
	return dst
}

func appendHash(dst []byte, h Hash) []byte {
	if h.bytes == nil {
		return appendUint(dst, h.u)
	}
	return appendBin(dst, h.bytes)
}

func appendArray(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x90|byte(n))
	case n <= math.MaxUint16:
		return append(dst, 0xdc, byte(n>>8), byte(n))
	default:
		return binary.BigEndian.AppendUint32(append(dst, 0xdd), uint32(n))
	}
}

func appendStr(dst []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		dst = append(dst, 0xa0|byte(n))
	case n <= math.MaxUint8:
		dst = append(dst, 0xd9, byte(n))
	case n <= math.MaxUint16:
		dst = append(dst, 0xda, byte(n>>8), byte(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, 0xdb), uint32(n))
	}
	return append(dst, s...)
}

func appendBin(dst []byte, b []byte) []byte {
	n := len(b)
	switch {
	case n <= math.MaxUint8:
		dst = append(dst, 0xc4, byte(n))
	case n <= math.MaxUint16:
		dst = append(dst, 0xc5, byte(n>>8), byte(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, 0xc6), uint32(n))
	}
	return append(dst, b...)
}

// appendUint writes u in msgpack's smallest form, as msgspec does.
func appendUint(dst []byte, u uint64) []byte {
	switch {
	case u < 128:
		return append(dst, byte(u))
	case u <= math.MaxUint8:
		return append(dst, 0xcc, byte(u))
	case u <= math.MaxUint16:
		return append(dst, 0xcd, byte(u>>8), byte(u))
	case u <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(dst, 0xce), uint32(u))
	default:
		return binary.BigEndian.AppendUint64(append(dst, 0xcf), u)
	}
}

func appendInt(dst []byte, v int64) []byte {
	if v >= 0 {
		return appendUint(dst, uint64(v))
	}
	switch {
	case v >= -32:
		return append(dst, byte(v))
	case v >= math.MinInt8:
		return append(dst, 0xd0, byte(v))
	case v >= math.MinInt16:
		return append(dst, 0xd1, byte(v>>8), byte(v))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(dst, 0xd2), uint32(v))
	default:
		return binary.BigEndian.AppendUint64(append(dst, 0xd3), uint64(v))
	}
}

func appendFloat64(dst []byte, f float64) []byte {
	return binary.BigEndian.AppendUint64(append(dst, 0xcb), math.Float64bits(f))
}
