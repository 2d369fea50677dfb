package kvevents

import (
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// mapEvent builds a map-layout event from key/value pairs (values already
// encoded), in the order given.
func mapEvent(kv ...any) []byte {
	b := appendMap(nil, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		b = appendStr(b, kv[i].(string))
		b = append(b, kv[i+1].([]byte)...)
	}
	return b
}

func batchOf(events ...[]byte) []byte {
	b := appendArray(nil, 3)
	b = appendFloat64(b, 1)
	b = appendArray(b, len(events))
	for _, e := range events {
		b = append(b, e...)
	}
	return append(b, 0)
}

var (
	mNil    = []byte{0xc0}
	mEmpty  = []byte{0x90}
	mStored = appendStr(nil, "BlockStored")
	mHashes = []byte{0x91, 0x07}
)

func storedFields(extra ...any) []any {
	return append([]any{"type", mStored, "block_hashes", mHashes, "parent_block_hash", mNil, "token_ids", mEmpty,
		"block_size", []byte{0x10}, "lora_id", mNil, "medium", appendStr(nil, "FS"), "lora_name", mNil}, extra...)
}

func TestDecodeMapFields(t *testing.T) {
	for _, c := range []struct {
		name string
		ev   []byte
		want Event
	}{
		{"required only", mapEvent(storedFields()...),
			Event{Kind: BlockStored, Hashes: []Hash{IntHash(7)}, BlockSize: 16, Medium: "FS"}},
		{"tag last, unknown and dropped fields skipped", mapEvent(append(storedFields()[2:],
			"kv_cache_spec_kind", appendStr(nil, "full_attention"), "kv_cache_spec_sliding_window", []byte{0x05},
			"future_field", []byte{0x92, 0x01, 0xa1, 'x'}, "type", mStored)...),
			Event{Kind: BlockStored, Hashes: []Hash{IntHash(7)}, BlockSize: 16, Medium: "FS"}},
		{"lora_id read and dropped", mapEvent(append(storedFields()[:10], append([]any{"lora_id", []byte{0x03}}, storedFields()[12:]...)...)...),
			Event{Kind: BlockStored, Hashes: []Hash{IntHash(7)}, BlockSize: 16, Medium: "FS"}},
		{"placeholder of vLLM's offloading tier", mapEvent("type", mStored, "block_hashes", mHashes, "parent_block_hash", mNil,
			"token_ids", mEmpty, "block_size", []byte{0}, "lora_id", mNil, "medium", appendStr(nil, "CPU"), "lora_name", mNil,
			"group_idx", []byte{0x01}),
			Event{Kind: BlockStored, Hashes: []Hash{IntHash(7)}, Medium: "CPU", GroupIdx: 1, HasGroupIdx: true}},
		{"removed ignores stored fields", mapEvent("type", appendStr(nil, "BlockRemoved"), "block_hashes", mHashes,
			"medium", mNil, "token_ids", []byte{0x91, 0x01}, "locality", appendStr(nil, "REMOTE")),
			Event{Kind: BlockRemoved, Hashes: []Hash{IntHash(7)}, Locality: LocalityRemote}},
		{"cleared", mapEvent("type", appendStr(nil, "AllBlocksCleared")), Event{Kind: AllBlocksCleared}},
	} {
		b, err := DecodeBatch(batchOf(c.ev))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if len(b.Events) != 1 || !reflect.DeepEqual(b.Events[0], c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, b.Events, c.want)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	good, _ := hex.DecodeString(goldenHex)
	without := func(field string) []byte {
		kv := storedFields()
		for i := 0; i < len(kv); i += 2 {
			if kv[i] == field {
				kv = append(kv[:i:i], kv[i+2:]...)
				break
			}
		}
		return mapEvent(kv...)
	}
	for _, c := range []struct {
		name, want string
		p          []byte
	}{
		{"empty", "truncated", nil},
		{"truncated", "truncated", good[:len(good)-1]},
		{"trailing", "trailing", append(append([]byte(nil), good...), 0)},
		{"one field", "2 or 3 fields", []byte{0x91, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0}},
		{"unknown array tag", "unknown event tag", []byte{0x93, 0x00, 0x91, 0x91, 0xa1, 'X', 0x00}},
		{"stored of 6 fields", "6 fields", []byte{0x93, 0x00, 0x91, 0x96, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x90, 0xc0, 0x90, 0x01, 0xc0, 0x00}},
		{"huge array claim", "elements", []byte{0x93, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x00}},
		{"huge map claim", "entries", batchOf([]byte{0xdf, 0xff, 0xff, 0xff, 0xff})},
		{"events not an array", "not an array", []byte{0x93, 0x00, 0x80, 0x00}},
		{"unknown map tag", "unknown event tag", batchOf(mapEvent("type", appendStr(nil, "BlockMoved")))},
		{"no tag", "unknown event tag", batchOf(mapEvent(storedFields()[2:]...))},
		{"missing medium", `without "medium"`, batchOf(without("medium"))},
		{"missing lora_name", `without "lora_name"`, batchOf(without("lora_name"))},
		{"field twice", "twice", batchOf(mapEvent(append(storedFields(), "medium", mNil)...))},
		{"non-string key", "field name", batchOf([]byte{0x81, 0x01, 0x02})},
		{"tokens for no block", "token ids", batchOf(mapEvent(append(storedFields()[:6], append([]any{"token_ids", []byte{0x91, 0x01}}, storedFields()[8:]...)...)...))},
		{"extra_keys count", "extra_keys entries", batchOf(mapEvent(append(storedFields(), "extra_keys", []byte{0x92, 0xc0, 0xc0})...))},
		{"mixed layouts", "the first was", batchOf(mapEvent("type", appendStr(nil, "AllBlocksCleared")), []byte{0x91, 0xb0, 'A', 'l', 'l', 'B', 'l', 'o', 'c', 'k', 's', 'C', 'l', 'e', 'a', 'r', 'e', 'd'})},
		{"negative token", "token id", batchOf(mapEvent(append(storedFields()[:6], append([]any{"token_ids", []byte{0x9f, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}}, storedFields()[8:]...)...)...))},
		{"empty hash bytes", "hash bytes", batchOf(mapEvent(append(storedFields()[:2], append([]any{"block_hashes", []byte{0x91, 0xc4, 0x00}}, storedFields()[4:]...)...)...))},
		{"deep extra key", "deeper", batchOf(mapEvent(append(storedFields(), "extra_keys", append([]byte{0x91}, append([]byte(strings.Repeat("\x91", 9)), 0xc0)...))...))},
	} {
		_, err := DecodeBatch(c.p)
		if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrFormat naming %q", c.name, err, c.want)
		}
	}
}

// roundTrip checks what decoded re-encodes, in the layout it was read in,
// to bytes that decode to the same.
func roundTrip(t *testing.T, b Batch) {
	again, err := DecodeBatch(AppendBatch(nil, &b))
	if err != nil {
		t.Fatalf("re-encoded batch does not decode: %v", err)
	}
	if len(b.Events) > 0 && !reflect.DeepEqual(again, b) {
		t.Fatalf("decoded %+v, re-encoded and decoded %+v", b, again)
	}
}

func FuzzDecodeBatch(f *testing.F) {
	good, _ := hex.DecodeString(goldenHex)
	f.Add(good)
	f.Add([]byte{0x93, 0x00, 0x90, 0x00})
	for _, c := range goldenV026() {
		if b, ok := c.(Batch); ok {
			f.Add(AppendBatch(nil, &b))
		}
	}
	f.Add(batchOf(mapEvent(storedFields("extra_keys", []byte{0x91, 0x92, 0xa1, 'a', 0xc4, 0x01, 0x02}, "group_idx", []byte{0x00})...)))
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := DecodeBatch(p)
		if err != nil {
			return
		}
		if b.DataParallelRank < 0 {
			b.DataParallelRank = 0 // a batch without a rank is re-encoded with one
		}
		roundTrip(t, b)
	})
}

func FuzzDecodeEvents(f *testing.F) {
	for _, c := range goldenV026() {
		if evs, ok := c.([]Event); ok {
			f.Add(AppendEvents(nil, evs, FormatVLLM026))
			f.Add(AppendEvents(nil, evs, FormatVLLM011))
		}
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		evs, fm, err := DecodeEvents(p)
		if err != nil {
			return
		}
		again, fm2, err := DecodeEvents(AppendEvents(nil, evs, fm))
		if err != nil || (len(evs) > 0 && (fm2 != fm || !reflect.DeepEqual(again, evs))) {
			t.Fatalf("%+v (%v) re-encoded decodes to %+v (%v), %v", evs, fm, again, fm2, err)
		}
	})
}
