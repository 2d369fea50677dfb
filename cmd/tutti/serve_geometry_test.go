package main

import (
	"testing"

	"github.com/tutti-io/tutti/kvshape"
)

func TestParseGeometry(t *testing.T) {
	g, err := parseGeometry("layers=32,kv_heads=8,head_dim=128,dtype=bf16,planes=2,page_tokens=16,chunk_pages=32")
	want := kvshape.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 32}
	if err != nil || g != want {
		t.Fatalf("%+v, %v", g, err)
	}
	for _, bad := range []string{"", "layers=2", "layers=2,layers=2", "layers=x,kv_heads=8,head_dim=128,dtype=bf16,planes=2,page_tokens=16,chunk_pages=32",
		"layers=32,kv_heads=8,head_dim=128,dtype=bf17,planes=2,page_tokens=16,chunk_pages=32",
		"layers=32,kv_heads=8,head_dim=128,dtype=bf16,planes=2,page_tokens=16,chunk_pages=32,x=1",
		"layers=0,kv_heads=8,head_dim=128,dtype=bf16,planes=2,page_tokens=16,chunk_pages=32"} {
		if _, err := parseGeometry(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
