package kernels

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// gccPrint compiles the C program prog (C11, -Wall -Werror, with cflags)
// with gcc, runs it and returns the fields it printed; the test fails on
// any compile or run error. gcc missing skips the test: the host tests of
// the device headers (tk_layout.h, tk_crc.h) need it.
func gccPrint(t *testing.T, prog string, cflags ...string) []string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skipf("gcc: %v", err)
	}
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "prog.c"), filepath.Join(dir, "prog")
	if err := os.WriteFile(src, []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-std=c11", "-Wall", "-Werror"}, cflags...)
	if out, err := exec.Command(gcc, append(args, "-o", bin, src)...).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return strings.Fields(string(bytes.TrimSpace(out)))
}
