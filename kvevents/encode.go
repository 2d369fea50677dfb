package kvevents

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Kind is an event's type.
type Kind uint8

// The event kinds of vLLM's KV event stream (the same in every Format).
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

// Format is the layout of the events, named by the vLLM release whose
// subscribers read it. The zero value is the default, vLLM 0.26's.
type Format uint8

const (
	// FormatVLLM026 (vLLM 0.26, vllm/distributed/kv_events.py): every event
	// a map of named fields tagged by "type", with lora_name, extra_keys,
	// group_idx and locality; what routers that read maps only understand.
	FormatVLLM026 Format = iota
	// FormatVLLM011 (vLLM 0.11): every event an array, the tag first; no
	// place for the fields 0.26 added (they are not written).
	FormatVLLM011
)

var formatNames = [...]string{FormatVLLM026: "vllm-0.26", FormatVLLM011: "vllm-0.11"}

func (f Format) String() string {
	if int(f) < len(formatNames) {
		return formatNames[f]
	}
	return fmt.Sprintf("Format(%d)", uint8(f))
}

// ParseFormat reads a Format's name ("vllm-0.26", "vllm-0.11").
func ParseFormat(s string) (Format, error) {
	for f, n := range formatNames {
		if s == n {
			return Format(f), nil
		}
	}
	return 0, fmt.Errorf("%w: format %q: want one of %v", ErrConfig, s, formatNames)
}

// The media and locality tutti's stores publish. vLLM 0.26's own storage
// tiers publish MEDIUM_FS ("FS", its file-system tier) with a locality
// relative to the publisher; tutti's SSDs are the node's own, so "LOCAL".
// The routers written against vLLM 0.11 count "DISK" as their disk tier, so
// that format keeps it (and has no locality field).
const (
	MediumFS       = "FS"
	MediumDisk     = "DISK"
	LocalityLocal  = "LOCAL"
	LocalityRemote = "REMOTE"
)

// Medium is what a store publishes its blocks as in format f.
func (f Format) Medium() string {
	if f == FormatVLLM011 {
		return MediumDisk
	}
	return MediumFS
}

// Locality is the locality a store publishes in format f ("" for none).
func (f Format) Locality() string {
	if f == FormatVLLM011 {
		return ""
	}
	return LocalityLocal
}

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

// RawValue is one msgpack value, encoded (an opaque field such as one
// block's extra_keys entry, passed through as the engine wrote it).
type RawValue []byte

// Event is one KV event. BlockStored uses every field (Parent only when
// HasParent); BlockRemoved uses Hashes, Medium, GroupIdx and Locality;
// AllBlocksCleared none. An empty string is published as None; lora_id is
// always None (vLLM deprecated it for lora_name).
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

	// The fields vLLM 0.26 added; FormatVLLM011 does not write them.

	LoRAName string
	// ExtraKeys holds one entry per block (what vLLM folded into the
	// block's hash besides its tokens: LoRA, multimodal inputs, cache salt),
	// each one msgpack value, nil for None; a nil slice is published as None.
	ExtraKeys   []RawValue
	GroupIdx    int
	HasGroupIdx bool
	Locality    string
}

// Batch is one published message's payload.
type Batch struct {
	TS               float64
	Events           []Event
	DataParallelRank int
	// Format is the events' layout (DecodeBatch: the one it read).
	Format Format
}

// Limits on what one encoded batch may hold (the decoder enforces them too).
const (
	MaxBatchEvents = 1 << 16
	MaxEventHashes = 1 << 16
	MaxEventTokens = 1 << 22
	MaxHashBytes   = 64
	MaxExtraBytes  = 4096 // one block's extra_keys entry, encoded
	maxMediumBytes = 64
	maxStringBytes = 1 << 10
	maxMapFields   = 64
	maxDecodeDepth = 8
)

// AppendBatch appends b's msgpack encoding in b.Format (vLLM's
// KVEventBatch, array-like in every format: [ts, [event...],
// data_parallel_rank]) to dst.
// data_parallel_rank is always written: vLLM's publisher fills it before
// encoding, and llm-d rejects a two-element batch.
func AppendBatch(dst []byte, b *Batch) []byte {
	dst = appendArray(dst, 3)
	dst = appendFloat64(dst, b.TS)
	dst = AppendEvents(dst, b.Events, b.Format)
	return appendInt(dst, int64(b.DataParallelRank))
}

// AppendEvents appends evs as one msgpack array of events in format f.
func AppendEvents(dst []byte, evs []Event, f Format) []byte {
	dst = appendArray(dst, len(evs))
	for i := range evs {
		dst = AppendEvent(dst, &evs[i], f)
	}
	return dst
}

// AppendEvent appends one event as vLLM's tagged struct in format f:
// msgspec's encoding of it, byte for byte (fields in declaration order,
// fields at their default omitted in maps, smallest ints).
func AppendEvent(dst []byte, e *Event, f Format) []byte {
	if f == FormatVLLM011 {
		return appendEventArray(dst, e)
	}
	switch e.Kind {
	case BlockStored:
		n := 8
		n += b2i(e.ExtraKeys != nil) + b2i(e.HasGroupIdx) + b2i(e.Locality != "")
		dst = appendMap(dst, n)
		dst = appendStr(appendStr(dst, "type"), e.Kind.Tag())
		dst = appendHashes(appendStr(dst, "block_hashes"), e.Hashes)
		dst = appendStr(dst, "parent_block_hash")
		dst = appendParent(dst, e)
		dst = appendTokens(appendStr(dst, "token_ids"), e.Tokens)
		dst = appendInt(appendStr(dst, "block_size"), int64(e.BlockSize))
		dst = append(appendStr(dst, "lora_id"), 0xc0)
		dst = appendOptStr(appendStr(dst, "medium"), e.Medium)
		dst = appendOptStr(appendStr(dst, "lora_name"), e.LoRAName)
		if e.ExtraKeys != nil {
			dst = appendArray(appendStr(dst, "extra_keys"), len(e.ExtraKeys))
			for _, x := range e.ExtraKeys {
				if x == nil {
					dst = append(dst, 0xc0)
				} else {
					dst = append(dst, x...)
				}
			}
		}
		return appendTail(dst, e)
	case BlockRemoved:
		dst = appendMap(dst, 3+b2i(e.HasGroupIdx)+b2i(e.Locality != ""))
		dst = appendStr(appendStr(dst, "type"), e.Kind.Tag())
		dst = appendHashes(appendStr(dst, "block_hashes"), e.Hashes)
		dst = appendOptStr(appendStr(dst, "medium"), e.Medium)
		return appendTail(dst, e)
	default:
		dst = appendMap(dst, 1)
		return appendStr(appendStr(dst, "type"), AllBlocksCleared.Tag())
	}
}

// appendTail writes the optional fields both stored and removed events end
// with (kv_cache_spec_kind and kv_cache_spec_sliding_window, between them
// in BlockStored, are always None: omitted).
func appendTail(dst []byte, e *Event) []byte {
	if e.HasGroupIdx {
		dst = appendInt(appendStr(dst, "group_idx"), int64(e.GroupIdx))
	}
	if e.Locality != "" {
		dst = appendStr(appendStr(dst, "locality"), e.Locality)
	}
	return dst
}

// appendEventArray is vLLM 0.11's array-like layout.
func appendEventArray(dst []byte, e *Event) []byte {
	switch e.Kind {
	case BlockStored:
		dst = appendArray(dst, 7)
		dst = appendStr(dst, e.Kind.Tag())
		dst = appendHashes(dst, e.Hashes)
		dst = appendParent(dst, e)
		dst = appendTokens(dst, e.Tokens)
		dst = appendInt(dst, int64(e.BlockSize))
		dst = append(dst, 0xc0) // lora_id
		return appendOptStr(dst, e.Medium)
	case BlockRemoved:
		dst = appendArray(dst, 3)
		dst = appendStr(dst, e.Kind.Tag())
		dst = appendHashes(dst, e.Hashes)
		return appendOptStr(dst, e.Medium)
	default:
		dst = appendArray(dst, 1)
		return appendStr(dst, AllBlocksCleared.Tag())
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func appendParent(dst []byte, e *Event) []byte {
	if e.HasParent {
		return appendHash(dst, e.Parent)
	}
	return append(dst, 0xc0)
}

func appendTokens(dst []byte, toks []uint32) []byte {
	dst = appendArray(dst, len(toks))
	for _, t := range toks {
		dst = appendUint(dst, uint64(t))
	}
	return dst
}

func appendOptStr(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, 0xc0)
	}
	return appendStr(dst, s)
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

func appendMap(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x80|byte(n))
	case n <= math.MaxUint16:
		return append(dst, 0xde, byte(n>>8), byte(n))
	default:
		return binary.BigEndian.AppendUint32(append(dst, 0xdf), uint32(n))
	}
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
