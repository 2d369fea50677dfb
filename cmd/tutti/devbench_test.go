package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestDevbenchFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{}, "--path is required"},
		{[]string{"--path", "/tmp", "--bs", "4x"}, "--bs"},
		{[]string{"--path", "/tmp", "--qd", "a"}, "--qd"},
		{[]string{"--path", "/tmp", "--engines", "spdk"}, "unknown engine"},
		{[]string{"--path", "/tmp", "--ops", "trim"}, "unknown op"},
		{[]string{"--path", "/tmp", "--size", "big"}, "--size"},
		{[]string{"--path", "/nonexistent-dir/sub/f", "--bs", "4k", "--qd", "1", "--engines", "uring", "--ops", "randread", "--runtime", "1ms", "--size", "1m"}, "no such file"},
		{[]string{"--path", "/tmp", "extra"}, "unexpected arguments"},
	} {
		var out, errb bytes.Buffer
		code := run(append([]string{"devbench"}, tc.args...), &out, &errb)
		if code == 0 || !strings.Contains(errb.String(), tc.msg) {
			t.Errorf("%v: exit %d, stderr %q; want failure mentioning %q", tc.args, code, errb.String(), tc.msg)
		}
	}
}

func TestDevbenchJSON(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"devbench", "--path", t.TempDir(), "--bs", "4k", "--qd", "2", "--engines", "uring,pread",
		"--ops", "randread", "--runtime", "10ms", "--size", "2m", "--json"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var rows []map[string]any
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil || len(rows) != 2 {
		t.Fatalf("JSON %q: %v", out.String(), err)
	}
	if rows[0]["engine"] != "uring" || rows[1]["engine"] != "pread" || rows[0]["op"] != "randread" || rows[0]["block_bytes"] != 4096.0 {
		t.Fatalf("rows %v", rows)
	}
}
