package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tutti-io/tutti/kvevents/kvindex"
	"github.com/tutti-io/tutti/membership"
	"github.com/tutti-io/tutti/membership/etcdtest"
)

// TestReplayKVEvents: `tutti replay --kv-events --etcd` registers the node
// for the run, and a router that follows it from etcd receives the store's
// events while the trace replays under a capacity that evicts: parents
// before children, no removal of a block it was not told of; the report
// says what was published.
func TestReplayKVEvents(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli, err := membership.Dial([]string{etcd}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	x := kvindex.New()
	defer x.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var puts, dels int
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = membership.Watch(ctx, cli, func(id string, rec *membership.Record) {
			mu.Lock()
			defer mu.Unlock()
			if rec == nil {
				dels++
				return
			}
			puts++
			if err := x.Follow(kvindex.Node{ID: id, Endpoint: rec.Events, ReplayEndpoint: rec.Replay, Topic: rec.Topic}); err != nil {
				t.Errorf("follow: %v", err)
			}
		}, nil)
	}()
	defer func() { cancel(); <-done }()

	spec := fmt.Sprintf("tcp://127.0.0.1:%d?replay=tcp://127.0.0.1:%d&topic=kv@replay@tiny", etcdtest.FreePort(t), etcdtest.FreePort(t))
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := run([]string{"replay", "--workload", "conversation", "--requests", "40", "--capacity-blocks", "60", "--backends", "tutti-cpu", "--no-ceiling", "--no-ebpf", "--dir", t.TempDir(),
		"--out", out, "--kv-events", spec, "--etcd", etcd, "--node-id", "replay"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("replay exit %d: %s", code, stderr.String())
	}
	mu.Lock()
	p, d := puts, dels
	mu.Unlock()
	if p != 1 {
		t.Fatalf("%d registrations seen, want 1", p)
	}
	st, ok := x.Stats("replay")
	if !ok || st.Batches == 0 || st.Removed == 0 || st.HashOnlyStores == 0 || st.DecodeErrors != 0 || st.OrphanStores != 0 || st.UnknownRemoves != 0 {
		t.Fatalf("router's view of the replay: %+v (ok %v)", st, ok)
	}
	t.Logf("router saw %d batches: %d blocks stored, %d removed, %d held at the end", st.Batches, st.Stored, st.Removed, st.Blocks)
	// The run revoked its lease at the end.
	deadline := time.Now().Add(5 * time.Second)
	for d == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		d = dels
		mu.Unlock()
	}
	if d != 1 {
		t.Fatalf("the key was not removed at the end of the run")
	}
	rep, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		matches, _ := filepath.Glob(filepath.Join(out, "*"))
		t.Fatalf("report: %v (dir has %v)", err, matches)
	}
	if !strings.Contains(string(rep), "published") || !strings.Contains(string(rep), "KV event batches") {
		t.Fatalf("the report does not say what was published:\n%s", rep)
	}
}

func TestReplayKVEventsFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--etcd", "127.0.0.1:1"},
		{"--kv-events", "udp://x"},
		{"--kv-events", "engine"},
		{"--kv-events", "tcp://127.0.0.1:1", "--backends", "dram"},
		{"--kv-events", "tcp://127.0.0.1:1", "--backends", "tutti-cpu,tutti-gpu"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"replay", "--workload", "conversation", "--requests", "1", "--no-ceiling"}, args...), &stdout, &stderr)
		if last := lastLine(stderr.String()); code == 0 || !strings.Contains(last, "--kv-events") && !strings.Contains(last, "--etcd") {
			t.Errorf("%v: exit %d, last line %q: want an error naming the flag", args, code, last)
		}
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
