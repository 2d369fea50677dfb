// Package abicheck reads what a C compiler and the Python binding make of
// the repository's C headers and KV layout, so tests can hold them against
// their Go homes: CHeader compiles a program with gcc that prints every
// struct field's offsetof and every enum constant of the given headers;
// Python runs a script under python3 with the binding on its path.
//
// It is test support: tests import it (internal/archtest's rules keep it out
// of the product). Both functions return ErrNoTool when gcc or python3 is not
// installed, so a caller can skip saying why.
package abicheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// ErrNoTool is wrapped when gcc or python3 is not on PATH.
var ErrNoTool = errors.New("abicheck: tool not installed")

// toolTimeout bounds every compile and run.
const toolTimeout = 60 * time.Second

// maxOutputBytes bounds what a tool may print.
const maxOutputBytes = 4 << 20

// Field is one member of a C struct.
type Field struct {
	Name   string `json:"name"`
	Offset int64  `json:"offset"`
	Size   int64  `json:"size"`
}

// Struct is a C struct as the compiler lays it out.
type Struct struct {
	Size   int64   `json:"size"`
	Fields []Field `json:"fields"`
}

// Header is what the compiler makes of a set of headers: every
// `typedef struct NAME {...} NAME;` and every enum constant.
type Header struct {
	Structs map[string]Struct
	Consts  map[string]int64
}

var (
	commentRE = regexp.MustCompile(`(?s)/\*.*?\*/|//[^\n]*`)
	structRE  = regexp.MustCompile(`(?s)typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;`)
	enumRE    = regexp.MustCompile(`(?s)\benum\s*\w*\s*\{(.*?)\}`)
	identRE   = regexp.MustCompile(`[A-Za-z_]\w*`)
	arrayRE   = regexp.MustCompile(`\[[^\]]*\]`)
)

// Declarations returns, from header source, each typedef'd struct's member
// names in order and the enum constants' names, in order of appearance.
// Nested structs and unions are not supported (the headers have none): a
// member list that does not parse is an error that names the struct.
func Declarations(src string) (structs map[string][]string, order []string, consts []string, err error) {
	src = commentRE.ReplaceAllString(src, " ")
	structs = map[string][]string{}
	for _, m := range structRE.FindAllStringSubmatch(src, -1) {
		name := m[3]
		if strings.ContainsAny(m[2], "{}") {
			return nil, nil, nil, fmt.Errorf("abicheck: struct %s: nested declarations are not supported", name)
		}
		var fields []string
		for _, decl := range strings.Split(m[2], ";") {
			decl = strings.TrimSpace(arrayRE.ReplaceAllString(decl, ""))
			if decl == "" {
				continue
			}
			parts := strings.Split(decl, ",")
			ids := identRE.FindAllString(parts[0], -1)
			if len(ids) < 2 {
				return nil, nil, nil, fmt.Errorf("abicheck: struct %s: cannot read member %q", name, decl)
			}
			fields = append(fields, ids[len(ids)-1])
			for _, p := range parts[1:] {
				ids := identRE.FindAllString(p, -1)
				if len(ids) != 1 {
					return nil, nil, nil, fmt.Errorf("abicheck: struct %s: cannot read member %q", name, p)
				}
				fields = append(fields, ids[0])
			}
		}
		if _, dup := structs[name]; !dup {
			order = append(order, name)
		}
		structs[name] = fields
	}
	for _, m := range enumRE.FindAllStringSubmatch(src, -1) {
		for _, e := range strings.Split(m[1], ",") {
			if ids := identRE.FindAllString(e, 1); len(ids) == 1 {
				consts = append(consts, ids[0])
			}
		}
	}
	return structs, order, consts, nil
}

// run executes cmd with a timeout and bounded output.
func run(cmd *exec.Cmd, stdin []byte) ([]byte, error) {
	var out, errb bytes.Buffer
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return nil, fmt.Errorf("%s: %w\n%s", cmd.Path, err, errb.String())
		}
	case <-time.After(toolTimeout):
		_ = cmd.Process.Kill()
		<-done
		return nil, fmt.Errorf("%s: timed out after %v", cmd.Path, toolTimeout)
	}
	if out.Len() > maxOutputBytes {
		return nil, fmt.Errorf("%s: %d bytes of output, want <= %d", cmd.Path, out.Len(), maxOutputBytes)
	}
	return out.Bytes(), nil
}

// CHeader compiles, with gcc, a program that includes headers (paths) and
// prints sizeof and every member's offsetof and sizeof of every typedef'd
// struct in them, and the value of every enum constant; it returns what it
// printed. tmp is a directory for the program.
func CHeader(tmp string, headers ...string) (Header, error) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		return Header{}, fmt.Errorf("%w: gcc: %v", ErrNoTool, err)
	}
	var prog strings.Builder
	prog.WriteString("#include <stddef.h>\n#include <stdint.h>\n#include <stdio.h>\n")
	args := []string{"-std=c11", "-Wall", "-Werror", "-o", filepath.Join(tmp, "offsets")}
	for _, h := range headers {
		abs, err := filepath.Abs(h)
		if err != nil {
			return Header{}, err
		}
		fmt.Fprintf(&prog, "#include %q\n", abs)
	}
	prog.WriteString("int main(void) {\n")
	for _, h := range headers {
		src, err := os.ReadFile(h)
		if err != nil {
			return Header{}, fmt.Errorf("abicheck: %w", err)
		}
		structs, order, consts, err := Declarations(string(src))
		if err != nil {
			return Header{}, fmt.Errorf("%s: %w", h, err)
		}
		for _, s := range order {
			fmt.Fprintf(&prog, "\tprintf(\"struct %s %%zu\\n\", sizeof(%s));\n", s, s)
			for _, f := range structs[s] {
				fmt.Fprintf(&prog, "\tprintf(\"field %s %s %%zu %%zu\\n\", offsetof(%s, %s), sizeof(((%s *)0)->%s));\n",
					s, f, s, f, s, f)
			}
		}
		for _, c := range consts {
			fmt.Fprintf(&prog, "\tprintf(\"const %s %%lld\\n\", (long long)%s);\n", c, c)
		}
	}
	prog.WriteString("\treturn 0;\n}\n")
	srcPath := filepath.Join(tmp, "offsets.c")
	if err := os.WriteFile(srcPath, []byte(prog.String()), 0o644); err != nil {
		return Header{}, err
	}
	if _, err := run(exec.Command(gcc, append(args, srcPath)...), nil); err != nil {
		return Header{}, fmt.Errorf("abicheck: compile %s: %w", srcPath, err)
	}
	out, err := run(exec.Command(filepath.Join(tmp, "offsets")), nil)
	if err != nil {
		return Header{}, fmt.Errorf("abicheck: run: %w", err)
	}
	return parseFacts(string(out))
}

// parseFacts reads CHeader's program output.
func parseFacts(out string) (h Header, err error) {
	h = Header{Structs: map[string]Struct{}, Consts: map[string]int64{}}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		num := func(i int) int64 {
			v, e := strconv.ParseInt(f[i], 10, 64)
			if e != nil && err == nil {
				err = fmt.Errorf("abicheck: line %q: %v", line, e)
			}
			return v
		}
		switch {
		case len(f) == 3 && f[0] == "struct":
			s := h.Structs[f[1]]
			s.Size = num(2)
			h.Structs[f[1]] = s
		case len(f) == 5 && f[0] == "field":
			s := h.Structs[f[1]]
			s.Fields = append(s.Fields, Field{Name: f[2], Offset: num(3), Size: num(4)})
			h.Structs[f[1]] = s
		case len(f) == 3 && f[0] == "const":
			h.Consts[f[1]] = num(2)
		default:
			return Header{}, fmt.Errorf("abicheck: unexpected line %q", line)
		}
	}
	return h, err
}

// Python runs script under python3 with root/python on PYTHONPATH, writes in
// to its stdin as JSON and decodes its stdout (JSON) into out.
func Python(root, script string, in, out any) error {
	py, err := exec.LookPath("python3")
	if err != nil {
		return fmt.Errorf("%w: python3: %v", ErrNoTool, err)
	}
	stdin, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("abicheck: encode python input: %w", err)
	}
	cmd := exec.Command(py, "-c", script)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(root, "python"), "PYTHONDONTWRITEBYTECODE=1")
	b, err := run(cmd, stdin)
	if err != nil {
		return fmt.Errorf("abicheck: python: %w", err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("abicheck: python output %.200q: %w", b, err)
	}
	return nil
}
