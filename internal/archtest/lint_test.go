package archtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// fakeGo stands in for `go` in TestLintRunsWhatTestDepsInstalls: `env`
// answers as go does (GOBIN as set, GOPATH from the environment) and
// `install` puts an executable where go install would, GOBIN when set, else
// the first GOPATH entry's bin. Nothing is downloaded.
const fakeGo = `#!/bin/sh
case "$1" in
env) [ "$2" = GOBIN ] && echo "$GOBIN"; [ "$2" = GOPATH ] && echo "$GOPATH"; exit 0 ;;
install) dir=${GOBIN:-${GOPATH%%:*}/bin}; mkdir -p "$dir" && printf '#!/bin/sh\n' >"$dir/staticcheck" && chmod +x "$dir/staticcheck" ;;
*) exit 2 ;;
esac
`

// TestLintRunsWhatTestDepsInstalls: `make lint` runs staticcheck from the
// path test-deps installed it to, with GOBIN set and without.
func TestLintRunsWhatTestDepsInstalls(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	for _, gobin := range []bool{false, true} {
		tmp := t.TempDir()
		bin := filepath.Join(tmp, "fakebin")
		if err := os.MkdirAll(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(bin, "go"), []byte(fakeGo), 0o755); err != nil {
			t.Fatal(err)
		}
		// A non-root id: test-deps stops after staticcheck (no mounts, no apt).
		if err := os.WriteFile(filepath.Join(bin, "id"), []byte("#!/bin/sh\necho 1000\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		env := []string{"PATH=" + bin + ":" + os.Getenv("PATH"), "HOME=" + tmp,
			"GOPATH=" + filepath.Join(tmp, "gopath") + ":" + filepath.Join(tmp, "second")}
		want := filepath.Join(tmp, "gopath", "bin", "staticcheck")
		if gobin {
			env = append(env, "GOBIN="+filepath.Join(tmp, "gobin"))
			want = filepath.Join(tmp, "gobin", "staticcheck")
		}
		dry := exec.Command("make", "-n", "-C", root, "lint", "GO=go")
		dry.Env = env
		out, err := dry.CombinedOutput()
		if err != nil {
			t.Fatalf("GOBIN set %v: make -n lint: %v\n%s", gobin, err, out)
		}
		m := regexp.MustCompile(`(?m)^(\S+/staticcheck) \./\.\.\.$`).FindStringSubmatch(string(out))
		if m == nil {
			t.Fatalf("GOBIN set %v: make -n lint runs no staticcheck:\n%s", gobin, out)
		}
		if m[1] != want {
			t.Errorf("GOBIN set %v: lint runs %s, go install puts it at %s", gobin, m[1], want)
		}
		deps := exec.Command("make", "-C", root, "test-deps", "GO=go")
		deps.Env = env
		if out, err := deps.CombinedOutput(); err != nil {
			t.Fatalf("GOBIN set %v: make test-deps: %v\n%s", gobin, err, out)
		}
		if _, err := os.Stat(m[1]); err != nil {
			t.Errorf("GOBIN set %v: test-deps did not install what lint runs: %v", gobin, err)
		}
		if strings.Contains(m[1], filepath.Join(tmp, "second")) {
			t.Errorf("GOBIN set %v: lint runs from the second GOPATH entry: %s", gobin, m[1])
		}
	}
}
