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
		{[]string{"--striped", "--path", "/tmp", "--size", "big"}, "--size"},
		{[]string{"--striped", "--path", "/tmp", "--size", "8m", "--buffer", "x"}, "--buffer"},
		{[]string{"--striped", "--path", "/tmp,/nonexistent-dir/sub/f", "--size", "8m"}, "no such file"},
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

func TestDevbenchStriped(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	var out, errb bytes.Buffer
	if code := run([]string{"devbench", "--striped", "--path", a + "," + b, "--size", "8m", "--json"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var st struct {
		BytesPerS float64 `json:"bytes_per_s"`
		Seconds   float64 `json:"seconds"`
		Devices   []struct {
			Engine string  `json:"engine"`
			IOPS   float64 `json:"iops"`
		} `json:"devices"`
	}
	if err := json.Unmarshal(out.Bytes(), &st); err != nil || len(st.Devices) != 2 || st.BytesPerS <= 0 || st.Seconds <= 0 || st.Devices[1].Engine != "uring" {
		t.Fatalf("JSON %q: %v", out.String(), err)
	}
	out.Reset()
	if code := run([]string{"devbench", "--striped", "--path", a, "--size", "4m"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "striped read ceiling") {
		t.Fatalf("exit %d: %s %s", code, out.String(), errb.String())
	}
	out.Reset()
	if code := run([]string{"devbench", "--striped", "--ops", "seqwrite", "--path", a + "," + b, "--size", "4m"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "striped write ceiling") {
		t.Fatalf("exit %d: %s %s", code, out.String(), errb.String())
	}
	out.Reset()
	if code := run([]string{"devbench", "--striped", "--ops", "randwrite", "--path", a, "--size", "4m"}, &out, &errb); code == 0 || !strings.Contains(errb.String(), "seqwrite") {
		t.Fatalf("--striped --ops randwrite: exit %d: %s", code, errb.String())
	}
}
