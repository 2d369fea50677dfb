package kvevents

import (
	"bytes"
	"encoding/hex"
	"testing"
)

// The pinned format: vLLM v0.11.0, vllm/distributed/kv_events.py:
//
//	class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
//	    ts: float
//	    events: list[Any]
//	    data_parallel_rank: Optional[int] = None
//	class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True): ...
//	class BlockStored(KVCacheEvent):
//	    block_hashes: list[ExternalBlockHash]   # ExternalBlockHash = bytes | int
//	    parent_block_hash: Optional[ExternalBlockHash]
//	    token_ids: list[int]
//	    block_size: int
//	    lora_id: Optional[int]
//	    medium: Optional[str]
//	class BlockRemoved(KVCacheEvent):
//	    block_hashes: list[ExternalBlockHash]
//	    medium: Optional[str]
//	class AllBlocksCleared(KVCacheEvent): pass
//
// tag=True puts the class name first in each event's array; no event field
// has a default, so omit_defaults drops nothing of them, and the batch's
// rank is written because it is never None here. goldenHex was produced by a
// second implementation, Debian's python3-msgpack 1.0.3 (which encodes these
// types as msgspec does: smallest ints, float64, bin for bytes), from:
//
//	msgpack.packb([1700000000.25, [
//	    ["AllBlocksCleared"],
//	    ["BlockStored", [1, 300], None, [1, 2, 3, 70000], 2, None, "DISK"],
//	    ["BlockStored", [bytes(range(32))], 300, [], 16, None, "DISK"],
//	    ["BlockRemoved", [2**64-1, 70000], "DISK"],
//	], 0], use_bin_type=True).hex()
const goldenHex = "93cb41d954fc401000009491b0416c6c426c6f636b73436c656172656497ab426c6f636b53746f7265649201cd012cc094010203ce0001117002c0a44449534b97ab426c6f636b53746f72656491c420000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fcd012c9010c0a44449534b93ac426c6f636b52656d6f76656492cfffffffffffffffffce00011170a44449534b00"

func goldenBatch() Batch {
	raw := make([]byte, 32)
	for i := range raw {
		raw[i] = byte(i)
	}
	return Batch{TS: 1700000000.25, DataParallelRank: 0, Events: []Event{
		{Kind: AllBlocksCleared},
		{Kind: BlockStored, Hashes: []Hash{IntHash(1), IntHash(300)}, Tokens: []uint32{1, 2, 3, 70000}, BlockSize: 2, Medium: MediumDisk},
		{Kind: BlockStored, Hashes: []Hash{BytesHash(raw)}, Parent: IntHash(300), HasParent: true, BlockSize: 16, Medium: MediumDisk},
		{Kind: BlockRemoved, Hashes: []Hash{IntHash(1<<64 - 1), IntHash(70000)}, Medium: MediumDisk},
	}}
}

func TestGoldenBatch(t *testing.T) {
	want, err := hex.DecodeString(goldenHex)
	if err != nil {
		t.Fatal(err)
	}
	b := goldenBatch()
	got := AppendBatch(nil, &b)
	if !bytes.Equal(got, want) {
		t.Fatalf("encoding differs from vLLM v0.11.0's:\n got %x\nwant %x", got, want)
	}
	// The batch is an array of exactly three fields (llm-d rejects two).
	if got[0] != 0x93 {
		t.Fatalf("batch header %#x, want fixarray of 3", got[0])
	}
	dec, err := DecodeBatch(want)
	if err != nil {
		t.Fatal(err)
	}
	if again := AppendBatch(nil, &dec); !bytes.Equal(again, want) {
		t.Fatalf("decode then encode changed the bytes:\n got %x\nwant %x", again, want)
	}
}

func TestEncodeSizes(t *testing.T) {
	for _, c := range []struct {
		name string
		got  []byte
		want string
	}{
		{"fixint", appendUint(nil, 127), "7f"},
		{"uint8", appendUint(nil, 128), "cc80"},
		{"uint16", appendUint(nil, 256), "cd0100"},
		{"uint32", appendUint(nil, 1<<16), "ce00010000"},
		{"uint64", appendUint(nil, 1<<32), "cf0000000100000000"},
		{"negfixint", appendInt(nil, -1), "ff"},
		{"int8", appendInt(nil, -33), "d0df"},
		{"int16", appendInt(nil, -129), "d1ff7f"},
		{"array16", appendArray(nil, 16)[:3], "dc0010"},
		{"str8", appendStr(nil, string(make([]byte, 32)))[:2], "d920"},
		{"bin8", appendBin(nil, []byte{7}), "c40107"},
	} {
		if h := hex.EncodeToString(c.got); h != c.want {
			t.Errorf("%s: %s, want %s", c.name, h, c.want)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	good, _ := hex.DecodeString(goldenHex)
	for _, c := range []struct {
		name string
		p    []byte
	}{
		{"empty", nil},
		{"truncated", good[:len(good)-1]},
		{"trailing", append(append([]byte(nil), good...), 0)},
		{"one field", []byte{0x91, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0}},
		{"unknown tag", []byte{0x93, 0x00, 0x91, 0x91, 0xa1, 'X', 0x00}},
		{"stored of 6 fields", []byte{0x93, 0x00, 0x91, 0x96, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x90, 0xc0, 0x90, 0x01, 0xc0, 0x00}},
		{"huge array claim", []byte{0x93, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x00}},
		{"map", []byte{0x93, 0x00, 0x80, 0x00}},
	} {
		if _, err := DecodeBatch(c.p); err == nil {
			t.Errorf("%s: decoded", c.name)
		}
	}
}

func FuzzDecodeBatch(f *testing.F) {
	good, _ := hex.DecodeString(goldenHex)
	f.Add(good)
	f.Add([]byte{0x93, 0x00, 0x90, 0x00})
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := DecodeBatch(p)
		if err != nil {
			return
		}
		// What decodes re-encodes and decodes to the same batch.
		again, err := DecodeBatch(AppendBatch(nil, &b))
		if err != nil {
			t.Fatalf("re-encoded batch does not decode: %v", err)
		}
		if len(again.Events) != len(b.Events) {
			t.Fatalf("%d events, then %d", len(b.Events), len(again.Events))
		}
	})
}
