package archtest

import (
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Import is one module-internal import of one package, from its code or its
// tests.
type Import struct {
	From, To string // paths relative to the module, e.g. "runtime/tp"
	Test     bool   // from a _test.go file
	File     string // the first file (relative to the root) that imports it
}

// Package is one directory of Go files of the module.
type Package struct {
	Path    string // relative to the module; "" is the root
	Main    bool   // its non-test files are package main
	Imports []Import
}

// skipDir reports directories that hold no package of the module.
func skipDir(root, path string, d fs.DirEntry) bool {
	name := d.Name()
	if path == root {
		return false
	}
	if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" ||
		name == "vendor" || name == "node_modules" || name == "bin" {
		return true
	}
	_, err := os.Stat(filepath.Join(path, "go.mod")) // a nested module is not this module
	return err == nil
}

// walkFiles calls visit for every file under root with its path and its
// slash-separated path relative to root, skipping the directories skip
// names (Scan's and Sizes' rules differ).
func walkFiles(root string, skip func(root, path string, d fs.DirEntry) bool, visit func(path, rel string) error) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if skip(root, path, d) {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		return visit(path, filepath.ToSlash(rel))
	})
}

// Scan parses the import blocks of every .go file under root (the module's
// directory) and returns its packages sorted by path.
func Scan(root string) ([]Package, error) {
	byDir := map[string]*Package{}
	seen := map[string]bool{}
	fset := token.NewFileSet()
	err := walkFiles(root, skipDir, func(path, rel string) error {
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return fmt.Errorf("archtest: parse %s: %w", path, err)
		}
		dir := filepath.ToSlash(filepath.Dir(rel))
		if dir == "." {
			dir = ""
		}
		p := byDir[dir]
		if p == nil {
			p = &Package{Path: dir}
			byDir[dir] = p
		}
		test := strings.HasSuffix(path, "_test.go")
		if !test && f.Name.Name == "main" {
			p.Main = true
		}
		for _, is := range f.Imports {
			ip, err := strconv.Unquote(is.Path.Value)
			if err != nil {
				return fmt.Errorf("archtest: %s: import %s: %w", rel, is.Path.Value, err)
			}
			to, ok := strings.CutPrefix(ip, module+"/")
			if !ok || to == dir {
				continue
			}
			key := fmt.Sprintf("%s\x00%s\x00%v", dir, to, test)
			if seen[key] {
				continue
			}
			seen[key] = true
			p.Imports = append(p.Imports, Import{From: dir, To: to, Test: test, File: rel})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]Package, 0, len(byDir))
	for _, p := range byDir {
		out = append(out, *p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// under reports whether path is prefix or one of its subpackages.
func under(path, prefix string) bool {
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// component returns the component a package belongs to (the longest listed
// prefix of its path) and its layer, or ok false.
func component(path string) (name string, layer int, ok bool) {
	for l, comps := range layers {
		for _, c := range comps {
			if under(path, c) && len(c) > len(name) {
				name, layer, ok = c, l, true
			}
		}
	}
	return name, layer, ok
}

func isTestSupport(path string) bool { return underAny(path, testSupport) }

func isLeaf(path string) bool { return underAny(path, leaves) }

func underAny(path string, prefixes []string) bool {
	for _, p := range prefixes {
		if under(path, p) {
			return true
		}
	}
	return false
}

// ErrUnplaced is wrapped by Check's error for a package in no component.
var ErrUnplaced = errors.New("archtest: package in no component of internal/archtest's layers")

// Check returns every import that breaks a rule, as "importer -> imported"
// keys (the form pending uses) with a message each, and an error for each
// package no component holds.
func Check(pkgs []Package) (violations map[string]string, errs []error) {
	violations = map[string]string{}
	for _, p := range pkgs {
		if p.Path == "" {
			errs = append(errs, fmt.Errorf("%w: the module root holds Go files", ErrUnplaced))
			continue
		}
		fromComp, fromLayer, ok := component(p.Path)
		if !ok {
			errs = append(errs, fmt.Errorf("%w: %s (add it to layers and docs/architecture.md)", ErrUnplaced, p.Path))
			continue
		}
		for _, im := range p.Imports {
			toComp, toLayer, ok := component(im.To)
			if !ok {
				errs = append(errs, fmt.Errorf("%w: %s, imported by %s", ErrUnplaced, im.To, im.File))
				continue
			}
			key := p.Path + " -> " + im.To
			switch {
			case p.Main && !under(p.Path, "cmd"):
				if toComp == "eval" || toComp == "cmd" {
					violations[key] = fmt.Sprintf("%s: a command outside cmd/ imports %s", im.File, im.To)
				}
			case toComp != fromComp && toLayer >= fromLayer && !p.Main:
				violations[key] = fmt.Sprintf("%s: %s (layer %d) imports %s (layer %d): only its own component or lower layers",
					im.File, p.Path, fromLayer, im.To, toLayer)
			}
			if !im.Test && isLeaf(p.Path) {
				violations[key] = fmt.Sprintf("%s: %s is a leaf: its code imports nothing of the module, here %s", im.File, p.Path, im.To)
			}
			if !im.Test && isTestSupport(im.To) && !isTestSupport(p.Path) &&
				!under(p.Path, "eval") && !under(p.Path, "cmd") {
				violations[key] = fmt.Sprintf("%s: non-test code of %s imports the test-support package %s", im.File, p.Path, im.To)
			}
		}
	}
	return violations, errs
}
