package kvmeta

import (
	"slices"
	"testing"

	"github.com/tutti-io/tutti/kvevents"
)

func TestKVMetaRecordRoundTrip(t *testing.T) {
	ids := []uint64{1, 2, 3}
	ms := []Meta{{Tokens: []uint32{1, 2, 3, 4}}, {Hash: []byte{9, 9}}, {Tokens: []uint32{5, 6, 7, 8}, Hash: []byte{1}}}
	p := appendMetaRecord(kvmetaHeaderBytes(4), ids, ms)
	var got []metaRecord
	good, stop, err := parseKVMeta(p, 4, func(r metaRecord) { got = append(got, r) })
	if err != nil || stop != nil || good != len(p) || len(got) != 1 {
		t.Fatalf("parse: good %d of %d, stop %v, err %v, %d records", good, len(p), stop, err, len(got))
	}
	for i := range ids {
		if got[0].ids[i] != ids[i] || !slices.Equal(got[0].metas[i].Tokens, ms[i].Tokens) || !slices.Equal(got[0].metas[i].Hash, ms[i].Hash) {
			t.Fatalf("block %d: %+v", i, got[0].metas[i])
		}
	}
	if _, _, err := parseKVMeta(p, 8, func(metaRecord) {}); err == nil {
		t.Fatal("a sidecar of another block size was read")
	}
	for cut := kvmetaHeader + 1; cut < len(p); cut++ {
		n := 0
		if _, stop, _ := parseKVMeta(p[:cut], 4, func(metaRecord) { n++ }); stop == nil || n != 0 {
			t.Fatalf("cut at %d: stop %v, %d records", cut, stop, n)
		}
	}
}

func FuzzParseKVMeta(f *testing.F) {
	f.Add(appendMetaRecord(kvmetaHeaderBytes(4), []uint64{1}, []Meta{{Tokens: []uint32{1, 2, 3, 4}, Hash: []byte{7}}}))
	f.Add(kvmetaHeaderBytes(4))
	f.Fuzz(func(t *testing.T, p []byte) {
		good, _, err := parseKVMeta(p, 4, func(r metaRecord) {
			if len(r.ids) != len(r.metas) || len(r.ids) == 0 || len(r.ids) > kvmetaMaxRecordBlocks {
				t.Fatalf("record of %d ids, %d metas", len(r.ids), len(r.metas))
			}
			for _, m := range r.metas {
				if len(m.Tokens) != 0 && len(m.Tokens) != 4 || len(m.Hash) > kvevents.MaxHashBytes {
					t.Fatalf("meta %+v out of bounds", m)
				}
			}
		})
		if err == nil && (good < kvmetaHeader || good > len(p)) {
			t.Fatalf("good %d of %d", good, len(p))
		}
	})
}
