package kernels

import (
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
)

// TestPlaneCRCMatchesCRC32C compiles tk_crc.h (the device's plane CRC, which
// tk_crc_kernel.cu runs one thread per segment) into a gcc program that does
// a block's work thread by thread over seeded planes of many sizes, and
// holds each plane's CRC to hash/crc32's Castagnoli CRC, objmap's chunk
// CRC: the save's checksums on PathGPU come from this code.
func TestPlaneCRCMatchesCRC32C(t *testing.T) {
	hdr, err := filepath.Abs("tk_crc.h")
	if err != nil {
		t.Fatal(err)
	}
	// Planes of real shapes (llama 8 heads x 128 bf16 x 16 tokens, MLA's
	// 576, fp8, one vector) and sizes around the segment rounding.
	sizes := []int{16, 32, 48, 4096, 4112, 18432, 32768, 65536, 4080, 16 * 255, 16 * 257, 16 * 513, 1 << 20}
	rng := rand.New(rand.NewPCG(7, 11))
	var prog strings.Builder
	fmt.Fprintf(&prog, `#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include %q
static uint32_t table[256];
static unsigned crc_of(const unsigned char *b, unsigned n) {
	tk_crc_plan plan;
	if (tk_crc_plan_make(&plan, n)) { printf("plan refused %%u\n", n); exit(1); }
	if (plan.segs > TK_CRC_THREADS || plan.seg %% 16 || (plan.segs - 1) * plan.seg >= n) { printf("bad plan %%u\n", n); exit(1); }
	uint32_t *w = malloc(n);
	memcpy(w, b, n);
	uint32_t x = 0;
	for (uint32_t t = 0; t < TK_CRC_THREADS; t++) x ^= tk_crc_segment(&plan, table, (const char *)w, t);
	free(w);
	return tk_crc_finish(&plan, x);
}
int main(void) {
	for (uint32_t i = 0; i < 256; i++) table[i] = tk_crc_table_entry(i);
	tk_crc_plan p;
	if (!tk_crc_plan_make(&p, 0) || !tk_crc_plan_make(&p, 24) || !tk_crc_plan_make(&p, (1ull << 30) + 16)) { printf("bad size planned\n"); return 1; }
`, hdr)
	var want []string
	for k, n := range sizes {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		if k == 0 {
			clear(b) // all zeros: the initial register's term alone
		}
		fmt.Fprintf(&prog, "\t{ static const unsigned char b[] = {")
		for i, x := range b {
			if i > 0 {
				prog.WriteByte(',')
			}
			fmt.Fprintf(&prog, "%d", x)
		}
		fmt.Fprintf(&prog, "}; printf(\"%%u\\n\", crc_of(b, %d)); }\n", n)
		want = append(want, fmt.Sprint(crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli))))
	}
	prog.WriteString("\treturn 0;\n}\n")
	got := gccPrint(t, prog.String(), "-O2")
	if len(got) != len(want) {
		t.Fatalf("%d CRCs printed, want %d: %v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("plane of %d bytes: tk_crc %s, hash/crc32 %s", sizes[i], got[i], want[i])
		}
	}
}
