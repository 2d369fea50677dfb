package archtest

import (
	"bufio"
	"errors"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// root is the module's directory (tests run in internal/archtest).
func root(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(r, "go.mod"))
	if err != nil || !strings.Contains(string(mod), "module "+module+"\n") {
		t.Fatalf("%s is not the root of %s (go.mod: %v)", r, module, err)
	}
	return r
}

// TestImportRules is the enforcement: every package of the repository, its
// tests included, keeps the rules of rules.go.
func TestImportRules(t *testing.T) {
	pkgs, err := Scan(root(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 10 {
		t.Fatalf("scanned only %d packages: the walk is broken", len(pkgs))
	}
	v, errs := Check(pkgs)
	for _, err := range errs {
		t.Error(err)
	}
	keys := make([]string, 0, len(v))
	for k := range v {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if why, ok := pending[k]; ok {
			t.Logf("pending: %s (%s)", v[k], why)
			continue
		}
		t.Errorf("%s", v[k])
	}
	for k := range pending {
		if _, ok := v[k]; !ok {
			t.Errorf("pending %q no longer happens: remove it from pending in rules.go", k)
		}
	}
}

// TestCheck shows that each rule catches what it forbids.
func TestCheck(t *testing.T) {
	lib := func(path string, ims ...Import) Package {
		for i := range ims {
			ims[i].From, ims[i].File = path, path+"/x.go"
		}
		return Package{Path: path, Imports: ims}
	}
	to := func(p string) Import { return Import{To: p} }
	test := func(p string) Import { return Import{To: p, Test: true} }
	tests := []struct {
		name   string
		pkg    Package
		want   []string // violation keys
		placed bool     // false: an ErrUnplaced error is expected
	}{
		{"down a layer", lib("runtime", to("objmap"), to("uring")), nil, true},
		{"own component", lib("runtime/tp", to("runtime")), nil, true},
		{"same layer", lib("objmap", to("devbench")), []string{"objmap -> devbench"}, true},
		{"up a layer", lib("uring", to("objmap")), []string{"uring -> objmap"}, true},
		{"product imports eval", lib("runtime", to("eval/harness")), []string{"runtime -> eval/harness"}, true},
		{"product test imports eval", lib("sched/sim", test("eval/model")), []string{"sched/sim -> eval/model"}, true},
		{"test imports test support", lib("runtime", test("internal/kvdata")), nil, true},
		{"code imports test support", lib("runtime", to("internal/crashtest")), []string{"runtime -> internal/crashtest"}, true},
		{"harness imports test support", lib("eval/harness", to("internal/kvdata")), nil, true},
		{"command imports eval", Package{Path: "sched/internal/rwbench", Main: true,
			Imports: []Import{{From: "sched/internal/rwbench", To: "eval/harness"}}}, []string{"sched/internal/rwbench -> eval/harness"}, true},
		{"command imports a higher layer", Package{Path: "sched/internal/rwbench", Main: true,
			Imports: []Import{{From: "sched/internal/rwbench", To: "devbench"}}}, nil, true},
		{"cmd imports eval", Package{Path: "cmd/tutti", Main: true,
			Imports: []Import{{From: "cmd/tutti", To: "eval/harness"}}}, nil, true},
		{"leaf imports the module", lib("kvshape", to("internal/trace")), []string{"kvshape -> internal/trace"}, true},
		{"runtime imports its mechanisms", lib("runtime", to("runtime/internal/admission"), to("runtime/internal/mover/cpu")), nil, true},
		{"a mechanism imports runtime", lib("runtime/internal/catalog", to("runtime")), []string{"runtime/internal/catalog -> runtime"}, true},
		{"the seam imports a mover", lib("runtime/internal/mover", to("runtime/internal/mover/cpu")), []string{"runtime/internal/mover -> runtime/internal/mover/cpu"}, true},
		{"one mover imports the other", lib("runtime/internal/mover/gpu", to("runtime/internal/mover/cpu")), []string{"runtime/internal/mover/gpu -> runtime/internal/mover/cpu"}, true},
		{"runtime code imports the GPU double", lib("runtime", to("runtime/internal/mover/gpu/gputest")), []string{"runtime -> runtime/internal/mover/gpu/gputest"}, true},
		{"runtime test imports the GPU double", lib("runtime", test("runtime/internal/mover/gpu/gputest")), nil, true},
		{"leaf's test imports test support", lib("kvshape", test("internal/abicheck")), nil, true},
		{"unplaced package", lib("newthing", to("uring")), nil, false},
		{"unplaced import", lib("runtime", to("newthing")), nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, errs := Check([]Package{tc.pkg})
			var got []string
			for k := range v {
				got = append(got, k)
			}
			sort.Strings(got)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("violations %v, want %v (%v)", got, tc.want, v)
			}
			if unplaced := len(errs) > 0 && errors.Is(errs[0], ErrUnplaced); unplaced == tc.placed {
				t.Errorf("errors %v, placed %v", errs, tc.placed)
			}
		})
	}
}

// TestScanSeesTestsAndMain checks Scan on a tree of its own: test imports are
// marked, package main is seen, testdata and nested modules are skipped.
func TestScanSeesTestsAndMain(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, src string) { writeFile(t, dir, rel, src) }
	write("a/a.go", "package a\nimport _ \""+module+"/b\"\n")
	write("a/a_test.go", "package a_test\nimport (\n\t\"testing\"\n\t_ \""+module+"/eval\"\n)\nvar _ testing.T\n")
	write("c/main.go", "package main\nimport _ \""+module+"/a\"\nfunc main() {}\n")
	write("a/testdata/x.go", "package x\nimport _ \""+module+"/eval\"\n")
	write("nested/go.mod", "module other\n")
	write("nested/n.go", "package n\nimport _ \""+module+"/eval\"\n")
	pkgs, err := Scan(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []Package{
		{Path: "a", Imports: []Import{{From: "a", To: "b", File: "a/a.go"}, {From: "a", To: "eval", Test: true, File: "a/a_test.go"}}},
		{Path: "c", Main: true, Imports: []Import{{From: "c", To: "a", File: "c/main.go"}}},
	}
	if !reflect.DeepEqual(pkgs, want) {
		t.Errorf("Scan:\n got %+v\nwant %+v", pkgs, want)
	}
}

// TestArchitectureDoc checks that docs/architecture.md's layer table,
// test-support line and leaves line say what rules.go says.
func TestArchitectureDoc(t *testing.T) {
	f, err := os.Open(filepath.Join(root(t), "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	docLayers := map[int][]string{}
	var docSupport, docLeaves []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "Test support:"); ok {
			docSupport = codeSpans(rest)
			continue
		}
		if rest, ok := strings.CutPrefix(line, "Leaves:"); ok {
			docLeaves = codeSpans(rest)
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), "|")
		if !strings.HasPrefix(line, "|") || len(cells) < 2 {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(cells[0]))
		if err != nil {
			continue // the header or another table
		}
		docLayers[n] = codeSpans(cells[1])
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	want := map[int][]string{}
	for l, comps := range layers {
		want[l] = append([]string(nil), comps...)
	}
	if !reflect.DeepEqual(docLayers, want) {
		t.Errorf("docs/architecture.md layers %v, rules.go %v", docLayers, want)
	}
	if !reflect.DeepEqual(docSupport, testSupport) {
		t.Errorf("docs/architecture.md test support %v, rules.go %v", docSupport, testSupport)
	}
	if !reflect.DeepEqual(docLeaves, leaves) {
		t.Errorf("docs/architecture.md leaves %v, rules.go %v", docLeaves, leaves)
	}
}

// codeSpans returns the `quoted` words of a Markdown fragment, in order.
func codeSpans(s string) []string {
	parts := strings.Split(s, "`")
	var out []string
	for i := 1; i < len(parts); i += 2 {
		out = append(out, parts[i])
	}
	return out
}

// TestReadmeExample checks that the README's Go example is the runtime's
// compiled Example: every line of the README's go block appears, in order,
// in runtime/example_test.go; and that the Example needs no package of the
// module but runtime and the KV shape (what an engine imports).
func TestReadmeExample(t *testing.T) {
	r := root(t)
	ex, err := parser.ParseFile(token.NewFileSet(), filepath.Join(r, "runtime", "example_test.go"), nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	for _, is := range ex.Imports {
		p, _ := strconv.Unquote(is.Path.Value)
		if to, ok := strings.CutPrefix(p, module+"/"); ok && to != "runtime" && to != "kvshape" {
			t.Errorf("runtime/example_test.go imports %s: an engine's example needs only runtime and kvshape", p)
		}
	}
	readme, err := os.ReadFile(filepath.Join(r, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "```go\n")
	block, _, closed := strings.Cut(block, "```")
	if !ok || !closed {
		t.Fatal("README.md has no ```go block")
	}
	src, err := os.ReadFile(filepath.Join(r, "runtime", "example_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(src), "\n") {
		lines = append(lines, strings.TrimSpace(l))
	}
	at, n := 0, 0
	for _, l := range strings.Split(block, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || l == "..." || strings.HasPrefix(l, "// ...") {
			continue
		}
		for at < len(lines) && lines[at] != l {
			at++
		}
		if at == len(lines) {
			t.Fatalf("README's Go example line %q is not in runtime/example_test.go (in order): copy the Example", l)
		}
		n++
	}
	if n < 10 {
		t.Fatalf("README's Go example has only %d lines", n)
	}
}

// writeFile writes src at dir/rel, making its directories.
func writeFile(t *testing.T, dir, rel, src string) {
	t.Helper()
	p := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
}
