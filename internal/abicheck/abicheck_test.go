package abicheck

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
)

func root(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func skipNoTool(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, ErrNoTool) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func TestDeclarations(t *testing.T) {
	src := `/* x */
typedef struct a_t {
	uint32_t x, y; /* two */
	const char *const *dirs; // pointer to pointers
	uint64_t arr[16];
	const struct_b *b;
} a_t;
enum { K_ONE = 1, K_TWO /* implicit */ };
typedef enum e_t { E_A = 4, E_B = 5 } e_t;
`
	structs, order, consts, err := Declarations(src)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"x", "y", "dirs", "arr", "b"}; !reflect.DeepEqual(structs["a_t"], want) || !reflect.DeepEqual(order, []string{"a_t"}) {
		t.Errorf("structs %v order %v, want a_t %v", structs, order, want)
	}
	if want := []string{"K_ONE", "K_TWO", "E_A", "E_B"}; !reflect.DeepEqual(consts, want) {
		t.Errorf("consts %v, want %v", consts, want)
	}
	if _, _, _, err := Declarations("typedef struct n { struct { int a; } in; } n;"); err == nil {
		t.Error("a nested struct parsed without error")
	}
}

// TestCHeaderOffsets compiles a header of known layout: the offsets are the
// compiler's, not a guess from sizes.
func TestCHeaderOffsets(t *testing.T) {
	dir := t.TempDir()
	h := filepath.Join(dir, "x.h")
	writeFile(t, h, "#include <stdint.h>\ntypedef struct s { uint8_t a; uint64_t b; uint32_t c[3]; } s;\nenum { X_SEVEN = 7 };\n")
	got, err := CHeader(dir, h)
	skipNoTool(t, err)
	want := Struct{Size: 32, Fields: []Field{{"a", 0, 1}, {"b", 8, 8}, {"c", 16, 12}}}
	if !reflect.DeepEqual(got.Structs["s"], want) || got.Consts["X_SEVEN"] != 7 {
		t.Errorf("got %+v, want struct %+v and X_SEVEN 7", got, want)
	}
}

// pyStructs prints, for the named ctypes structures of tutti._lib, their
// size and every field's offset and size, and every int constant of the module.
const pyStructs = `
import ctypes, json, sys
import tutti._lib as L
names = json.load(sys.stdin)
out = {"structs": {}, "consts": {}}
for n in names:
    cls = getattr(L, n, None)
    if cls is None:
        continue
    out["structs"][n] = {"size": ctypes.sizeof(cls), "fields": [
        {"name": f[0], "offset": getattr(cls, f[0]).offset, "size": getattr(cls, f[0]).size} for f in cls._fields_]}
for k, v in vars(L).items():
    if k.isupper() and type(v) is int:
        out["consts"][k] = v
json.dump(out, sys.stdout)
`

// TestPythonMirrorsCHeader holds python/tutti/_lib.py's ctypes copies of
// runtime/capi/tutti.h against what gcc makes of the header: every struct
// with the same fields in the same order at the same offsets and sizes, and
// every enum constant the binding names with the same value.
func TestPythonMirrorsCHeader(t *testing.T) {
	r := root(t)
	hdr, err := CHeader(t.TempDir(), filepath.Join(r, "runtime", "capi", "tutti.h"))
	skipNoTool(t, err)
	var names []string
	for n := range hdr.Structs {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(names) < 4 {
		t.Fatalf("tutti.h: only structs %v", names)
	}
	var py struct {
		Structs map[string]Struct `json:"structs"`
		Consts  map[string]int64  `json:"consts"`
	}
	skipNoTool(t, Python(r, pyStructs, names, &py))
	for _, n := range names {
		c, p := hdr.Structs[n], py.Structs[n]
		if p.Fields == nil {
			t.Errorf("python/tutti/_lib.py has no ctypes copy of %s", n)
			continue
		}
		if !reflect.DeepEqual(c, p) {
			t.Errorf("%s: C %+v\npython %+v", n, c, p)
		}
	}
	checked := 0
	for c, v := range hdr.Consts {
		name, ok := strings.CutPrefix(c, "TUTTI_")
		pv, named := py.Consts[name]
		if !ok || !named {
			continue
		}
		checked++
		if pv != v {
			t.Errorf("%s = %d in tutti.h, %s = %d in _lib.py", c, v, name, pv)
		}
	}
	for _, family := range []string{"PATH_", "DTYPE_", "LAYOUT_", "MEMORY_"} {
		for c := range hdr.Consts {
			if strings.HasPrefix(c, "TUTTI_"+family) {
				if _, ok := py.Consts[strings.TrimPrefix(c, "TUTTI_")]; !ok {
					t.Errorf("_lib.py does not name %s", c)
				}
			}
		}
	}
	if checked < 8 {
		t.Errorf("only %d constants compared", checked)
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
