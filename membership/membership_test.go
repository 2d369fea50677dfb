package membership_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tutti-io/tutti/membership"
	"github.com/tutti-io/tutti/membership/etcdtest"
)

const ttl = 2 * time.Second

// expirySlack is what etcd may take beyond the TTL to expire a lease (it
// checks leases every 500 ms and its clock starts at the last keepalive).
const expirySlack = 3 * time.Second

func record(id string) membership.Record {
	return membership.Record{ID: id, Events: "tcp://127.0.0.1:5557", Replay: "tcp://127.0.0.1:5558", Topic: "kv@" + id + "@m",
		Epoch: 7, CapacityBytes: 1 << 30, Medium: "DISK", BlockTokens: 16}
}

// watcher records what Watch reports, for waiting on.
type watcher struct {
	mu   sync.Mutex
	cond *sync.Cond
	live map[string]membership.Record
	gone map[string]time.Time
}

func watch(t *testing.T, endpoint string) *watcher {
	t.Helper()
	cli, err := membership.Dial([]string{endpoint}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{live: map[string]membership.Record{}, gone: map[string]time.Time{}}
	w.cond = sync.NewCond(&w.mu)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = membership.Watch(ctx, cli, func(id string, rec *membership.Record) {
			w.mu.Lock()
			if rec == nil {
				delete(w.live, id)
				w.gone[id] = time.Now()
			} else {
				w.live[id] = *rec
				delete(w.gone, id)
			}
			w.cond.Broadcast()
			w.mu.Unlock()
		}, func(key string, err error) { t.Errorf("bad record at %s: %v", key, err) })
	}()
	t.Cleanup(func() { cancel(); <-done; cli.Close() })
	return w
}

// wait waits until cond holds (checked under w.mu) or timeout.
func (w *watcher) wait(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	tm := time.AfterFunc(timeout, func() { w.mu.Lock(); w.cond.Broadcast(); w.mu.Unlock() })
	defer tm.Stop()
	deadline := time.Now().Add(timeout)
	w.mu.Lock()
	defer w.mu.Unlock()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		w.cond.Wait()
	}
}

func TestRegisterWatchClose(t *testing.T) {
	ep := etcdtest.Start(t)
	w := watch(t, ep)
	cli, err := membership.Dial([]string{ep}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	reg, err := membership.Register(cli, record("a"), ttl)
	if err != nil {
		t.Fatal(err)
	}
	w.wait(t, "a registered", 5*time.Second, func() bool { _, ok := w.live["a"]; return ok })
	w.mu.Lock()
	got := w.live["a"]
	w.mu.Unlock()
	if got != record("a") {
		t.Fatalf("watched %+v, want %+v", got, record("a"))
	}
	// Keepalives hold the key past several TTLs.
	time.Sleep(2*ttl + ttl/2)
	w.mu.Lock()
	_, ok := w.live["a"]
	w.mu.Unlock()
	if !ok || reg.Err() != nil {
		t.Fatalf("key gone while the node lives (err %v)", reg.Err())
	}
	start := time.Now()
	if err := reg.Close(); err != nil {
		t.Fatal(err)
	}
	w.wait(t, "a revoked", ttl, func() bool { _, ok := w.gone["a"]; return ok })
	t.Logf("key gone %v after Close (revoke)", time.Since(start).Round(time.Millisecond))
}

func TestRegisterRejects(t *testing.T) {
	for _, r := range []membership.Record{{ID: "", Events: "tcp://x:1"}, {ID: "a/b", Events: "tcp://x:1"}, {ID: "a", Events: "x:1"}} {
		if _, err := membership.Register(nil, r, ttl); !errors.Is(err, membership.ErrRecord) {
			t.Errorf("%+v: %v, want ErrRecord", r, err)
		}
	}
	if _, err := membership.Register(nil, record("a"), time.Second); err == nil {
		t.Error("a 1 s lease was accepted")
	}
}

const childEnv = "TUTTI_MEMBERSHIP_CHILD"

// TestMain makes the test binary a node when childEnv names an etcd.
func TestMain(m *testing.M) {
	if ep := os.Getenv(childEnv); ep != "" {
		cli, err := membership.Dial([]string{ep}, 2*time.Second)
		if err == nil {
			_, err = membership.Register(cli, record("child"), ttl)
		}
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("registered")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestKillNineExpires: a node process killed with SIGKILL sends no revoke;
// its key goes when the lease expires, within the TTL plus etcd's slack.
func TestKillNineExpires(t *testing.T) {
	ep := etcdtest.Start(t)
	w := watch(t, ep)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+ep)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "registered" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child said %q", line)
	}
	w.wait(t, "child registered", 5*time.Second, func() bool { _, ok := w.live["child"]; return ok })
	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	w.wait(t, "child's key expired", ttl+expirySlack, func() bool { _, ok := w.gone["child"]; return ok })
	w.mu.Lock()
	after := w.gone["child"].Sub(killed)
	w.mu.Unlock()
	t.Logf("key of a kill -9'd node gone %v after the kill (lease TTL %v)", after.Round(time.Millisecond), ttl)
}

func FuzzParseRecord(f *testing.F) {
	f.Add([]byte(`{"id":"a","events_endpoint":"tcp://127.0.0.1:1","epoch":1,"capacity_bytes":1,"medium":"DISK"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := membership.ParseRecord(b)
		if err == nil && r.Validate() != nil {
			t.Fatalf("ParseRecord accepted an invalid record %+v", r)
		}
	})
}
