package objmap

import (
	"os"
	"os/exec"
)

// runChild runs the test binary with one extra environment variable and
// returns its standard output.
func runChild(exe, runFlag, env string) (string, error) {
	cmd := exec.Command(exe, runFlag)
	cmd.Env = append(os.Environ(), env)
	out, err := cmd.Output()
	return string(out), err
}
