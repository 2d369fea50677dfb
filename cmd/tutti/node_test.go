package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/kvevents"
	"github.com/tutti-io/tutti/kvevents/kvindex"
	"github.com/tutti-io/tutti/membership"
	"github.com/tutti-io/tutti/membership/etcdtest"
	"github.com/tutti-io/tutti/prefix"
)

const nodeWait = 15 * time.Second

// nodeProc is a `tutti node` child process.
type nodeProc struct {
	t     *testing.T
	id    string
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *json.Decoder
	ready nodeReply
}

func startNode(t *testing.T, id, dir, etcd string, capBlocks int) *nodeProc {
	t.Helper()
	pub, rep := etcdtest.FreePort(t), etcdtest.FreePort(t)
	spec := fmt.Sprintf("tcp://127.0.0.1:%d?replay=tcp://127.0.0.1:%d&topic=kv@%s@tiny", pub, rep, id)
	args := []string{"node", "--dir", dir, "--node-id", id, "--kv-events", spec, "--capacity-blocks", fmt.Sprint(capBlocks), "--pages", "256"}
	if etcd != "" {
		args = append(args, "--etcd", etcd, "--etcd-ttl", "2s")
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &nodeProc{t: t, id: id, cmd: cmd, in: in, out: json.NewDecoder(bufio.NewReader(out))}
	t.Cleanup(func() { p.kill() })
	p.ready = p.reply()
	if p.ready.Op != "ready" || p.ready.Events == "" {
		t.Fatalf("node %s: %+v", id, p.ready)
	}
	return p
}

func (p *nodeProc) reply() nodeReply {
	p.t.Helper()
	var r nodeReply
	done := make(chan error, 1)
	go func() { done <- p.out.Decode(&r) }()
	select {
	case err := <-done:
		if err != nil {
			p.t.Fatalf("node %s: reading its reply: %v", p.id, err)
		}
	case <-time.After(nodeWait):
		p.t.Fatalf("node %s: no reply within %v", p.id, nodeWait)
	}
	if r.Error != "" {
		p.t.Fatalf("node %s: %s", p.id, r.Error)
	}
	return r
}

func (p *nodeProc) do(op string, tokens []uint32) nodeReply {
	p.t.Helper()
	var b strings.Builder
	b.WriteString(op)
	for _, t := range tokens {
		fmt.Fprintf(&b, " %d", t)
	}
	b.WriteByte('\n')
	if _, err := io.WriteString(p.in, b.String()); err != nil {
		p.t.Fatal(err)
	}
	return p.reply()
}

func (p *nodeProc) kill() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		_ = p.cmd.Wait()
	}
}

// router is the reference consumer of the tests: nodes from etcd, their
// blocks from their KV events, a route by the longest prefix.
type router struct {
	t    *testing.T
	x    *kvindex.Index
	mu   sync.Mutex
	cond *sync.Cond
	live map[string]membership.Record
	gone map[string]time.Time
}

func newRouter(t *testing.T, etcd string) *router {
	t.Helper()
	cli, err := membership.Dial([]string{etcd}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r := &router{t: t, x: kvindex.New(), live: map[string]membership.Record{}, gone: map[string]time.Time{}}
	r.cond = sync.NewCond(&r.mu)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = membership.Watch(ctx, cli, func(id string, rec *membership.Record) {
			if rec == nil {
				r.x.Drop(id)
			} else if err := r.x.Follow(kvindex.Node{ID: id, Endpoint: rec.Events, ReplayEndpoint: rec.Replay, Topic: rec.Topic}); err != nil {
				t.Errorf("following %s: %v", id, err)
			}
			r.mu.Lock()
			if rec == nil {
				delete(r.live, id)
				r.gone[id] = time.Now()
			} else {
				r.live[id] = *rec
				delete(r.gone, id)
			}
			r.cond.Broadcast()
			r.mu.Unlock()
		}, func(key string, err error) { t.Errorf("bad record at %s: %v", key, err) })
	}()
	t.Cleanup(func() { cancel(); <-done; r.x.Close(); cli.Close() })
	return r
}

// waitFor polls cond (the index changes on its own goroutines) until it
// holds or nodeWait passed.
func (r *router) waitFor(what string, cond func() bool) {
	r.t.Helper()
	deadline := time.Now().Add(nodeWait)
	for !cond() {
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: not within %v", what, nodeWait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *router) registered(id string, epoch uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.live[id]
	return ok && rec.Epoch == epoch
}

func tinyBlockTokens(t *testing.T) int {
	p, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	return p.BlockTokens()
}

// tokensFor is request k's prompt of n blocks: token ids a router and the
// node both hash with prefix.ChainFromTokens.
func tokensFor(k, n, bt int) []uint32 {
	t := make([]uint32, n*bt)
	for i := range t {
		t[i] = uint32(k*1_000_003 + i)
	}
	return t
}

func chainKeys(t *testing.T, tokens []uint32, bt int) []kvevents.Hash {
	ids, err := prefix.ChainFromTokens(nil, tokens, bt, nodeChainSeed)
	if err != nil {
		t.Fatal(err)
	}
	hs := make([]kvevents.Hash, len(ids))
	for i, id := range ids {
		hs[i] = kvevents.IntHash(id)
	}
	return hs
}

// TestRouterTwoNodes: two tutti node processes, each on its own directory,
// publish their saves; the reference router, which learns the nodes from
// etcd and their blocks from the events, sends each request to the node
// with its longest prefix. A route to a prefix evicted meanwhile restores
// less and the rest is recomputed: what is restored is always its own bytes.
func TestRouterTwoNodes(t *testing.T) {
	etcd := etcdtest.Start(t)
	r := newRouter(t, etcd)
	bt := tinyBlockTokens(t)
	a := startNode(t, "a", t.TempDir(), etcd, 12)
	b := startNode(t, "b", t.TempDir(), etcd, 64)
	r.waitFor("both registered", func() bool { return r.registered("a", a.ready.Epoch) && r.registered("b", b.ready.Epoch) })

	x, y := tokensFor(1, 6, bt), tokensFor(2, 6, bt)
	if s := a.do("save", x); s.Saved != 6 {
		t.Fatalf("a saved %+v", s)
	}
	if s := b.do("save", y); s.Saved != 6 {
		t.Fatalf("b saved %+v", s)
	}
	if s := b.do("save", x[:2*bt]); s.Saved != 2 {
		t.Fatalf("b saved %+v", s)
	}
	kx, ky := chainKeys(t, x, bt), chainKeys(t, y, bt)
	r.waitFor("routes", func() bool {
		na, n := r.x.Pick(kx)
		nb, m := r.x.Pick(ky)
		return na == "a" && n == 6 && nb == "b" && m == 6
	})
	if id, n := r.x.Pick(chainKeys(t, tokensFor(3, 4, bt), bt)); id != "" || n != 0 {
		t.Fatalf("an unknown prompt routed to %q (%d blocks)", id, n)
	}
	for _, tc := range []struct {
		p      *nodeProc
		tokens []uint32
	}{{a, x}, {b, y}} {
		if l := tc.p.do("load", tc.tokens); l.Loaded != 6 || !*l.Verified {
			t.Fatalf("routed load on %s: %+v", tc.p.id, l)
		}
	}
	// Route x to a, then a evicts it (capacity 12 blocks) before the load.
	if id, _ := r.x.Pick(kx); id != "a" {
		t.Fatalf("x routed to %q", id)
	}
	for k := 10; k < 13; k++ {
		a.do("save", tokensFor(k, 6, bt))
	}
	l := a.do("load", x)
	if l.Loaded >= 6 || !*l.Verified {
		t.Fatalf("load of an evicted prefix: %+v (want fewer than 6 blocks, each its own bytes)", l)
	}
	t.Logf("route to an evicted prefix: %d of 6 blocks restored, %d recomputed", l.Loaded, 6-l.Loaded)
	r.waitFor("the eviction seen", func() bool { _, n := r.x.Pick(kx[:6]); return n <= 2 || n == l.Loaded })
	for _, id := range []string{"a", "b"} {
		st, _ := r.x.Stats(id)
		if st.OrphanStores != 0 || st.UnknownRemoves != 0 || st.HashOnlyStores != 0 || st.DecodeErrors != 0 {
			t.Fatalf("router's view of %s: %+v", id, st)
		}
	}
}

// TestNodeKillNine: a node killed with SIGKILL leaves etcd within its lease
// TTL plus slack; restarted on its directory it publishes AllBlocksCleared,
// a new epoch and what it recovered (with the token ids), and is routed to
// again.
func TestNodeKillNine(t *testing.T) {
	etcd := etcdtest.Start(t)
	r := newRouter(t, etcd)
	bt := tinyBlockTokens(t)
	dir := t.TempDir()
	a := startNode(t, "a", dir, etcd, 64)
	r.waitFor("a registered", func() bool { return r.registered("a", a.ready.Epoch) })
	x := tokensFor(1, 5, bt)
	a.do("save", x)
	kx := chainKeys(t, x, bt)
	r.waitFor("x routed to a", func() bool { id, n := r.x.Pick(kx); return id == "a" && n == 5 })

	killed := time.Now()
	a.kill()
	r.waitFor("a's key expired", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		_, ok := r.gone["a"]
		return ok
	})
	r.mu.Lock()
	expiry := r.gone["a"].Sub(killed)
	r.mu.Unlock()
	if expiry > 2*time.Second+3*time.Second {
		t.Fatalf("key gone %v after the kill, lease TTL 2s", expiry)
	}
	if id, _ := r.x.Pick(kx); id != "" {
		t.Fatalf("x still routed to %q after its node left", id)
	}
	t.Logf("kill -9: key gone %v after the kill (TTL 2s)", expiry.Round(time.Millisecond))

	a2 := startNode(t, "a", dir, etcd, 64)
	if a2.ready.Epoch == a.ready.Epoch || a2.ready.Recovered != 5 {
		t.Fatalf("restarted node: epoch %d (was %d), recovered %d blocks", a2.ready.Epoch, a.ready.Epoch, a2.ready.Recovered)
	}
	r.waitFor("restarted a routed", func() bool { id, n := r.x.Pick(kx); return r.registered("a", a2.ready.Epoch) && id == "a" && n == 5 })
	st, _ := r.x.Stats("a")
	if st.Resets == 0 || st.HashOnlyStores != 0 || st.OrphanStores != 0 {
		t.Fatalf("router's view of the restarted node: %+v", st)
	}
	if l := a2.do("load", x); l.Loaded != 5 || !*l.Verified {
		t.Fatalf("load after the restart: %+v", l)
	}
}
