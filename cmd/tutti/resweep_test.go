package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestResweepErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "services.json")
	if err := os.WriteFile(bad, []byte(`{"version":1,"backends":[{"backend":"a","services":[{"layers":0}]}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"resweep"}, "want one report directory"},
		{[]string{"resweep", "--slo-ms", "-1", dir}, "--slo-ms -1"},
		{[]string{"resweep", filepath.Join(dir, "missing")}, "no such file"},
		{[]string{"resweep", dir}, "backend a request 0: 0 layers"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(tc.args, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), tc.want) {
			t.Fatalf("%v: exit %d, stderr %q, want it to name %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}
