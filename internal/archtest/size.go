package archtest

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// The size limits: no source file of the product, the CLI or the
// harness over MaxFileLines lines, no Go function over MaxFuncLines (from its
// func line to its closing brace). Tests and generated files are exempt.
const (
	MaxFileLines = 600
	MaxFuncLines = 120
)

// sizeExts are the source files whose length is limited.
var sizeExts = map[string]bool{".go": true, ".cu": true, ".cuh": true, ".h": true, ".c": true, ".py": true, ".sh": true}

// Oversize is one file or Go function over its limit.
type Oversize struct {
	File  string // relative to the root, slash-separated
	Func  string // "" for the whole file; "Name" or "Recv.Name"
	Line  int    // where the function starts (0 for a file)
	Lines int
}

func (o Oversize) String() string {
	if o.Func == "" {
		return fmt.Sprintf("%s: %d lines (limit %d)", o.File, o.Lines, MaxFileLines)
	}
	return fmt.Sprintf("%s:%d: func %s: %d lines (limit %d)", o.File, o.Line, o.Func, o.Lines, MaxFuncLines)
}

// Key is how an allowlist names it: the file, or "file: Func".
func (o Oversize) Key() string {
	if o.Func == "" {
		return o.File
	}
	return o.File + ": " + o.Func
}

// isTestFile reports files that only tests run: Go tests, the Python tests,
// test programs of the kernels.
func isTestFile(rel string) bool {
	base := filepath.Base(rel)
	return strings.HasSuffix(base, "_test.go") || strings.HasPrefix(base, "test_") ||
		strings.HasPrefix(rel, "python/tests/") || strings.Contains(rel, "/test/")
}

// skipSizeDir reports directories holding no source of the module: hidden
// ones, build outputs, test data, nested modules.
func skipSizeDir(root, path string, d fs.DirEntry) bool {
	if path == root {
		return false
	}
	switch name := d.Name(); {
	case strings.HasPrefix(name, "."), name == "testdata", name == "vendor", name == "node_modules",
		name == "bin", name == "build", name == "__pycache__":
		return true
	}
	_, err := os.Stat(filepath.Join(path, "go.mod"))
	return err == nil
}

// Sizes returns every non-test source file under root over MaxFileLines and
// every Go function of one over MaxFuncLines, sorted by file and line.
func Sizes(root string) ([]Oversize, error) {
	var out []Oversize
	fset := token.NewFileSet()
	err := walkFiles(root, skipSizeDir, func(path, rel string) error {
		if !sizeExts[filepath.Ext(path)] || isTestFile(rel) {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if !strings.HasSuffix(path, ".go") {
			if n := bytes.Count(src, []byte("\n")); n > MaxFileLines {
				out = append(out, Oversize{File: rel, Lines: n})
			}
			return nil
		}
		f, err := parser.ParseFile(fset, path, src, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return fmt.Errorf("archtest: parse %s: %w", rel, err)
		}
		if ast.IsGenerated(f) {
			return nil
		}
		if n := bytes.Count(src, []byte("\n")); n > MaxFileLines {
			out = append(out, Oversize{File: rel, Lines: n})
		}
		out = append(out, funcSizes(fset, f, rel)...)
		return nil
	})
	sort.Slice(out, func(i, j int) bool {
		if out[i].File != out[j].File {
			return out[i].File < out[j].File
		}
		return out[i].Line < out[j].Line
	})
	return out, err
}

// funcSizes returns the top-level functions of a parsed Go file over
// MaxFuncLines.
func funcSizes(fset *token.FileSet, f *ast.File, rel string) []Oversize {
	var out []Oversize
	for _, decl := range f.Decls {
		fd, ok := decl.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		start := fset.Position(fd.Pos()).Line
		if n := fset.Position(fd.Body.End()).Line - start + 1; n > MaxFuncLines {
			out = append(out, Oversize{File: rel, Func: funcName(fd), Line: start, Lines: n})
		}
	}
	return out
}

// funcName is "Name", or "Recv.Name" for a method.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
			continue
		case *ast.IndexExpr:
			t = x.X
			continue
		case *ast.IndexListExpr:
			t = x.X
			continue
		case *ast.Ident:
			return x.Name + "." + fd.Name.Name
		}
		return fd.Name.Name
	}
}
