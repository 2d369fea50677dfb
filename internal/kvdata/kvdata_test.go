package kvdata

import (
	"bytes"
	"testing"
)

func TestFillVerify(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, 9, 4096, 4099} {
		k := Key{Block: 42, Layer: 3, Plane: 1, Page: 7}
		buf := make([]byte, n)
		Fill(buf, k)
		if off := Verify(buf, k); off != -1 {
			t.Fatalf("len %d: verify of own fill failed at %d", n, off)
		}
		for _, flip := range []int{0, n / 2, n - 1} {
			if n == 0 {
				break
			}
			buf[flip] ^= 0x10
			if off := Verify(buf, k); off != flip {
				t.Fatalf("len %d: flipped byte %d, verify says %d", n, flip, off)
			}
			buf[flip] ^= 0x10
		}
		// A prefix of a page is the prefix of the content.
		if n >= 8 {
			short := make([]byte, n-3)
			Fill(short, k)
			if !bytes.Equal(short, buf[:n-3]) {
				t.Fatalf("len %d: content depends on the length", n)
			}
		}
	}
}

func TestWordMatchesFill(t *testing.T) {
	k := Key{Block: 1 << 40, Layer: 79, Plane: 0, Page: 31}
	buf := make([]byte, 64)
	Fill(buf, k)
	for i := 0; i < 8; i++ {
		w := Word(k, i)
		for j := 0; j < 8; j++ {
			if buf[8*i+j] != byte(w>>(8*j)) {
				t.Fatalf("word %d byte %d", i, j)
			}
		}
	}
}

// Every field of the key changes the content: a page restored into the wrong
// layer, plane, slot or block is caught.
func TestKeysDiffer(t *testing.T) {
	base := Key{Block: 5, Layer: 1, Plane: 0, Page: 2}
	ref := make([]byte, 256)
	Fill(ref, base)
	for _, k := range []Key{
		{Block: 6, Layer: 1, Plane: 0, Page: 2},
		{Block: 5, Layer: 2, Plane: 0, Page: 2},
		{Block: 5, Layer: 1, Plane: 1, Page: 2},
		{Block: 5, Layer: 1, Plane: 0, Page: 3},
		{Block: 5, Layer: 0, Plane: 1, Page: 2},
	} {
		if Verify(ref, k) == -1 {
			t.Fatalf("key %+v verifies the content of %+v", k, base)
		}
		if off := Verify(ref, k); off > 7 {
			t.Fatalf("key %+v: first difference only at byte %d", k, off)
		}
	}
}

func TestChunk(t *testing.T) {
	c := ChunkLayout{Pages: 4, Planes: 2, PageBytes: 64}
	buf := make([]byte, c.Bytes())
	FillChunk(buf, c, 9, 2)
	if off := VerifyChunk(buf, c, 9, 2); off != -1 {
		t.Fatalf("verify chunk: %d", off)
	}
	// Page 1 plane 1 lives at (1*2+1)*64.
	if Verify(buf[192:256], Key{Block: 9, Layer: 2, Plane: 1, Page: 1}) != -1 {
		t.Fatal("page 1 plane 1 not where the layout says")
	}
	buf[300] ^= 1
	if off := VerifyChunk(buf, c, 9, 2); off != 300 {
		t.Fatalf("corruption at 300 reported at %d", off)
	}
	if VerifyChunk(buf, c, 9, 3) == -1 {
		t.Fatal("another layer verified")
	}
}

func BenchmarkFill(b *testing.B) {
	buf := make([]byte, 1<<20)
	b.SetBytes(int64(len(buf)))
	for i := 0; b.Loop(); i++ {
		Fill(buf, Key{Block: uint64(i)})
	}
}

func BenchmarkVerify(b *testing.B) {
	buf := make([]byte, 1<<20)
	Fill(buf, Key{Block: 1})
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if Verify(buf, Key{Block: 1}) != -1 {
			b.Fatal("mismatch")
		}
	}
}
