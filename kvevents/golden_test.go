package kvevents

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"os"
	"reflect"
	"strings"
	"testing"
)

// vLLM 0.26's structs (vllm/distributed/kv_events.py) are msgspec structs:
// EventBatch array_like with omit_defaults ([ts, events, rank]); every event
// a map (KVCacheEvent: omit_defaults, tag=True: "type" first, then the
// fields in declaration order, those at their default left out). The bytes
// in testdata/vllm-0.26.golden were written by those structs themselves
// (testdata/vllm_golden.py runs their source under msgspec); goldenV026
// builds the same batches.
func goldenV026() map[string]any {
	raw := make([]byte, 32)
	for i := range raw {
		raw[i] = byte(i)
	}
	ek := func(hexs string) RawValue { b, _ := hex.DecodeString(hexs); return b }
	tutti := []Event{
		{Kind: AllBlocksCleared},
		{Kind: BlockStored, Hashes: []Hash{IntHash(1), IntHash(300)}, Tokens: []uint32{1, 2, 3, 70000}, BlockSize: 2,
			Medium: MediumFS, HasGroupIdx: true, Locality: LocalityLocal},
		{Kind: BlockStored, Hashes: []Hash{BytesHash(raw)}, Parent: IntHash(300), HasParent: true, BlockSize: 16,
			Medium: MediumFS, LoRAName: "adapter-a",
			// ("adapter-a", ("mm-0", 3))
			ExtraKeys:   []RawValue{ek("92a9616461707465722d6192a46d6d2d3003")},
			HasGroupIdx: true, Locality: LocalityLocal},
		{Kind: BlockRemoved, Hashes: []Hash{IntHash(1<<64 - 1), IntHash(70000)}, Medium: MediumFS, HasGroupIdx: true, Locality: LocalityLocal},
	}
	nones := []Event{
		{Kind: BlockStored, Hashes: []Hash{IntHash(5), IntHash(6)}, Parent: BytesHash(raw), HasParent: true,
			Tokens: []uint32{9, 9, 9, 9}, BlockSize: 2,
			// [None, (b"\x01\x02", -7, "salt")]
			ExtraKeys: []RawValue{nil, ek("93c4020102f9a473616c74")}},
		{Kind: BlockRemoved, Hashes: []Hash{IntHash(5)}},
	}
	return map[string]any{
		"batch":       Batch{TS: 1700000000.25, Events: tutti, DataParallelRank: 0},
		"batch_nones": Batch{TS: 0.5, Events: nones, DataParallelRank: 3},
		"events":      tutti,
	}
}

func readGolden(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]byte{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		name, hx, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		b, err := hex.DecodeString(hx)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out[name] = b
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestGoldenV026(t *testing.T) {
	golden := readGolden(t, "testdata/vllm-0.26.golden")
	cases := goldenV026()
	if len(golden) != len(cases) {
		t.Fatalf("%d golden vectors, %d cases: regenerate testdata (vllm_golden.py) with the cases in step", len(golden), len(cases))
	}
	for name, c := range cases {
		want, ok := golden[name]
		if !ok {
			t.Fatalf("no golden vector %q", name)
		}
		var got []byte
		switch c := c.(type) {
		case Batch:
			got = AppendBatch(nil, &c)
			dec, err := DecodeBatch(want)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if dec.Format != FormatVLLM026 || !reflect.DeepEqual(dec.Events, c.Events) || dec.TS != c.TS || dec.DataParallelRank != c.DataParallelRank {
				t.Errorf("%s: vLLM's bytes decode to\n%+v\nwant\n%+v", name, dec, c)
			}
		case []Event:
			got = AppendEvents(nil, c, FormatVLLM026)
			evs, f, err := DecodeEvents(want)
			if err != nil || f != FormatVLLM026 || !reflect.DeepEqual(evs, c) {
				t.Errorf("%s: vLLM's bytes decode to %+v %v %v", name, evs, f, err)
			}
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: encoding differs from vLLM 0.26's:\n got %x\nwant %x", name, got, want)
		}
	}
}

// The vLLM 0.11 format: EventBatch and KVCacheEvent both array_like with
// omit_defaults; tag=True puts the class name first in each event's array:
//
//	["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]
//	["BlockRemoved", block_hashes, medium]
//	["AllBlocksCleared"]
//
// No event field has a default there, so omit_defaults drops nothing.
// goldenHex was produced by a second implementation, Debian's
// python3-msgpack 1.0.3 (which encodes these types as msgspec does:
// smallest ints, float64, bin for bytes), from:
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
	return Batch{TS: 1700000000.25, DataParallelRank: 0, Format: FormatVLLM011, Events: []Event{
		{Kind: AllBlocksCleared},
		{Kind: BlockStored, Hashes: []Hash{IntHash(1), IntHash(300)}, Tokens: []uint32{1, 2, 3, 70000}, BlockSize: 2, Medium: MediumDisk},
		{Kind: BlockStored, Hashes: []Hash{BytesHash(raw)}, Parent: IntHash(300), HasParent: true, BlockSize: 16, Medium: MediumDisk},
		{Kind: BlockRemoved, Hashes: []Hash{IntHash(1<<64 - 1), IntHash(70000)}, Medium: MediumDisk},
	}}
}

func TestGoldenV011(t *testing.T) {
	want, err := hex.DecodeString(goldenHex)
	if err != nil {
		t.Fatal(err)
	}
	b := goldenBatch()
	// The 0.26 fields have no place in the array layout: set, they change nothing.
	b.Events[1].LoRAName, b.Events[1].Locality, b.Events[1].HasGroupIdx = "x", LocalityLocal, true
	got := AppendBatch(nil, &b)
	if !bytes.Equal(got, want) {
		t.Fatalf("encoding differs from vLLM 0.11's:\n got %x\nwant %x", got, want)
	}
	// The batch is an array of exactly three fields (llm-d rejects two).
	if got[0] != 0x93 {
		t.Fatalf("batch header %#x, want fixarray of 3", got[0])
	}
	dec, err := DecodeBatch(want)
	if err != nil {
		t.Fatal(err)
	}
	if dec.Format != FormatVLLM011 || !reflect.DeepEqual(dec.Events, goldenBatch().Events) {
		t.Fatalf("decoded %+v", dec)
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
		{"fixmap", appendMap(nil, 15), "8f"},
		{"map16", appendMap(nil, 16), "de0010"},
		{"str8", appendStr(nil, string(make([]byte, 32)))[:2], "d920"},
		{"bin8", appendBin(nil, []byte{7}), "c40107"},
	} {
		if h := hex.EncodeToString(c.got); h != c.want {
			t.Errorf("%s: %s, want %s", c.name, h, c.want)
		}
	}
}
