package kernels

import (
	"errors"
	"reflect"
	"testing"

	"github.com/tutti-io/tutti/internal/abicheck"
)

// TestMirrorsMatchHeader holds the Go copies of tutti_kernels.h's structs
// that cross the ABI as arrays (a plan's entries and page map, the entry
// results) against what gcc makes of the header: the same number of fields
// at the same offsets with the same sizes, and the same size (restorer.go's
// compile-time checks cover only the size).
func TestMirrorsMatchHeader(t *testing.T) {
	hdr, err := abicheck.CHeader(t.TempDir(), "tutti_kernels.h")
	if errors.Is(err, abicheck.ErrNoTool) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct {
		c   string
		goT reflect.Type
	}{
		{"tk_io_entry", reflect.TypeOf(ioEntry{})},
		{"tk_page_map", reflect.TypeOf(PageMap{})},
		{"tk_entry_result", reflect.TypeOf(EntryResult{})},
	} {
		cs, ok := hdr.Structs[m.c]
		if !ok {
			t.Errorf("%s is not in tutti_kernels.h", m.c)
			continue
		}
		var gf []abicheck.Field
		for i := 0; i < m.goT.NumField(); i++ {
			f := m.goT.Field(i)
			gf = append(gf, abicheck.Field{Name: f.Name, Offset: int64(f.Offset), Size: int64(f.Type.Size())})
		}
		if int64(m.goT.Size()) != cs.Size || len(gf) != len(cs.Fields) {
			t.Errorf("%s: C %d bytes in %d fields, Go %s %d bytes in %d fields", m.c, cs.Size, len(cs.Fields), m.goT, m.goT.Size(), len(gf))
			continue
		}
		for i, c := range cs.Fields {
			if gf[i].Offset != c.Offset || gf[i].Size != c.Size {
				t.Errorf("%s.%s at %d (%d bytes), Go %s.%s at %d (%d bytes)", m.c, c.Name, c.Offset, c.Size, m.goT, gf[i].Name, gf[i].Offset, gf[i].Size)
			}
		}
	}
}
