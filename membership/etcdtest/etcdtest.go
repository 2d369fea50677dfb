// Package etcdtest starts a real etcd server (Debian's etcd-server, binary
// /usr/bin/etcd) for tests, on 127.0.0.1 ports picked free, in a temporary
// data directory, and stops it at the end of the test.
package etcdtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/tutti-io/tutti/membership"
)

// Binary is where Debian's etcd-server puts the server.
const Binary = "/usr/bin/etcd"

const startTimeout = 20 * time.Second

// FreePort returns a 127.0.0.1 port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start runs etcd and returns its client endpoint, or skips the test when
// the binary is missing (CI installs it: apt-get install etcd-server).
func Start(t testing.TB) string {
	t.Helper()
	if _, err := os.Stat(Binary); err != nil {
		t.Skipf("no %s (apt-get install etcd-server; CI installs it)", Binary)
	}
	dir := t.TempDir()
	client := fmt.Sprintf("http://127.0.0.1:%d", FreePort(t))
	peer := fmt.Sprintf("http://127.0.0.1:%d", FreePort(t))
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, Binary, "--name", "t", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "t="+peer, "--log-level", "error")
	logf, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("starting etcd: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		logf.Close()
	})
	cli, err := membership.Dial([]string{client}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	deadline := time.Now().Add(startTimeout)
	for {
		c, cc := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Get(c, "health")
		cc()
		if err == nil {
			return client
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("etcd at %s not up within %v: %v\n%s", client, startTimeout, err, log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
