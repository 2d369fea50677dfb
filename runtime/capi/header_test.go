package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// protoRE matches a function prototype: return type, name, parameters.
var protoRE = regexp.MustCompile(`(?m)^(?:extern\s+)?([A-Za-z_][\w\s\*]*?)\s*\b(tutti_\w+)\s*\(([^)]*)\)\s*;`)

// signatures extracts "ret name(type, type)" per tutti_ function, with
// parameter names, const and spacing normalized away.
func signatures(t *testing.T, src string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range protoRE.FindAllStringSubmatch(src, -1) {
		var params []string
		if p := strings.TrimSpace(m[3]); p != "" && p != "void" {
			for _, a := range strings.Split(p, ",") {
				params = append(params, normType(a, true))
			}
		}
		sig := normType(m[1], false) + " " + m[2] + "(" + strings.Join(params, ", ") + ")"
		if prev, dup := out[m[2]]; dup && prev != sig {
			t.Fatalf("%s declared twice differently: %q and %q", m[2], prev, sig)
		}
		out[m[2]] = sig
	}
	return out
}

var identRE = regexp.MustCompile(`[A-Za-z_]\w*|\*`)

func normType(s string, dropName bool) string {
	toks := identRE.FindAllString(s, -1)
	var keep []string
	for _, tok := range toks {
		if tok != "const" {
			keep = append(keep, tok)
		}
	}
	if dropName && len(keep) > 1 && keep[len(keep)-1] != "*" {
		keep = keep[:len(keep)-1]
	}
	return strings.ReplaceAll(strings.Join(keep, " "), " *", "*")
}

// TestHeaderMatchesGenerated runs cgo over this package (what
// `go build -buildmode=c-shared` does to emit bin/libtutti.h) and checks
// that the exported functions and the prototypes in tutti.h are the same set
// with the same signatures.
func TestHeaderMatchesGenerated(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go tool not in PATH")
	}
	dir := t.TempDir()
	gen := filepath.Join(dir, "libtutti.h")
	var goFiles []string
	ents, _ := os.ReadDir(".")
	for _, e := range ents {
		n := e.Name()
		if strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
			src, _ := os.ReadFile(n)
			if strings.Contains(string(src), "import \"C\"") {
				goFiles = append(goFiles, n)
			}
		}
	}
	args := append([]string{"tool", "cgo", "-objdir", dir, "-exportheader", gen, "--", "-I", "."}, goFiles...)
	cmd := exec.Command(gobin, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	genSrc, err := os.ReadFile(gen)
	if err != nil {
		t.Fatal(err)
	}
	hdrSrc, err := os.ReadFile("tutti.h")
	if err != nil {
		t.Fatal(err)
	}
	// The generated header quotes the preamble (which includes tutti.h by
	// name only), so its own prototypes are the extern lines.
	var externs []string
	for _, l := range strings.Split(string(genSrc), "\n") {
		if strings.HasPrefix(l, "extern ") && strings.Contains(l, "tutti_") {
			externs = append(externs, l)
		}
	}
	got := signatures(t, strings.Join(externs, "\n"))
	want := signatures(t, string(hdrSrc))
	if len(got) == 0 || len(want) == 0 {
		t.Fatalf("parsed %d generated and %d checked-in prototypes", len(got), len(want))
	}
	var names []string
	for n := range want {
		names = append(names, n)
	}
	for n := range got {
		if _, ok := want[n]; !ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		g, w := got[n], want[n]
		switch {
		case g == "":
			t.Errorf("tutti.h declares %s, the library does not export it", w)
		case w == "":
			t.Errorf("the library exports %s, tutti.h does not declare it", g)
		case g != w:
			t.Errorf("signature drift:\n  tutti.h:   %s\n  generated: %s", w, g)
		}
	}
}

// TestHeaderEnums checks the enum values and version macros of tutti.h
// against the Go constants the library uses.
func TestHeaderEnums(t *testing.T) {
	src, err := os.ReadFile("tutti.h")
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]int{}
	for _, m := range regexp.MustCompile(`\b(TUTTI_[A-Z0-9_]+)\s*=\s*(\d+)`).FindAllStringSubmatch(string(src), -1) {
		v, _ := strconv.Atoi(m[2])
		vals[m[1]] = v
	}
	for _, m := range regexp.MustCompile(`#define\s+(TUTTI_ABI_\w+)\s+(\d+)`).FindAllStringSubmatch(string(src), -1) {
		v, _ := strconv.Atoi(m[2])
		vals[m[1]] = v
	}
	want := map[string]int{
		"TUTTI_ABI_MAJOR": abiMajor, "TUTTI_ABI_MINOR": abiMinor,
		"TUTTI_PATH_CPU": pathCPU, "TUTTI_PATH_GPU": pathGPU,
		"TUTTI_DTYPE_BF16": dtypeBF16, "TUTTI_DTYPE_FP16": dtypeFP16, "TUTTI_DTYPE_FP8": dtypeFP8, "TUTTI_DTYPE_FP32": dtypeFP32,
		"TUTTI_LAYOUT_PER_LAYER": layoutPerLayer, "TUTTI_LAYOUT_CROSS_LAYER": layoutCrossLayer,
		"TUTTI_MEMORY_HOST": memoryHost, "TUTTI_MEMORY_CUDA": memoryCUDA,
		"TUTTI_GPU_READS_FROM_DEVICES": gpuReadsFromDevices, "TUTTI_LOAD_PROMISED": loadPromised,
	}
	for s := status(0); s < statusCount; s++ {
		want[s.String()] = int(s)
	}
	for name, w := range want {
		if g, ok := vals[name]; !ok {
			t.Errorf("tutti.h lacks %s", name)
		} else if g != w {
			t.Errorf("%s = %d in tutti.h, %d in Go", name, g, w)
		}
		delete(vals, name)
	}
	for name, v := range vals {
		t.Errorf("tutti.h has %s = %d, unknown to the Go side", name, v)
	}
}

// TestCProgram builds the library as `make python-test` does, then compiles
// testdata/abi_test.c against tutti.h (-Wall -Werror, C11), links it to the
// library and runs it: the ABI as a C engine sees it, round trip included.
// The header must also compile as C++.
func TestCProgram(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go tool not in PATH")
	}
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not in PATH")
	}
	dir := t.TempDir()
	lib := filepath.Join(dir, "libtutti.so")
	if out, err := exec.Command(gobin, "build", "-buildmode=c-shared", "-o", lib, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -buildmode=c-shared: %v\n%s", err, out)
	}
	exe := filepath.Join(dir, "abi_test")
	args := []string{"-std=c11", "-Wall", "-Wextra", "-Werror", "-I", ".", "-o", exe, "testdata/abi_test.c",
		"-L", dir, "-ltutti", "-Wl,-rpath," + dir}
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	store := filepath.Join(dir, "store")
	if err := os.Mkdir(store, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(exe, store).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("abi_test: %v\n%s", err, out)
	}
	if cxx, err := exec.LookPath("g++"); err == nil {
		cmd := exec.Command(cxx, "-x", "c++", "-std=c++17", "-Wall", "-Werror", "-fsyntax-only", "-I", ".", "-")
		cmd.Stdin = strings.NewReader("#include \"tutti.h\"\nint main() { return tutti_abi_version() == 0; }\n")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("tutti.h as C++: %v\n%s", err, out)
		}
	}
}
