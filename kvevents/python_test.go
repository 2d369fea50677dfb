package kvevents_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/tutti-io/tutti/kvevents"
)

// pyConsumer is a second implementation of vLLM's consumer side: libzmq
// (python3-zmq) and python3-msgpack. It replays from seq 0 through the
// ROUTER, then reads one live PUB message, and prints what it decoded.
const pyConsumer = `
import json, sys, zmq, msgpack
pub, replay, topic = sys.argv[1], sys.argv[2], sys.argv[3].encode()
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB); sub.setsockopt(zmq.SUBSCRIBE, topic); sub.connect(pub)
d = ctx.socket(zmq.DEALER); d.connect(replay)
d.send_multipart([b"", (0).to_bytes(8, "big")])
out = {"replay": [], "live": None}
d.setsockopt(zmq.RCVTIMEO, 10000)
while True:
    _, seq, payload = d.recv_multipart()
    seq = int.from_bytes(seq, "big", signed=True)
    if seq == -1:
        break
    out["replay"].append([seq, msgpack.unpackb(payload)])
print("ready", flush=True)
sub.setsockopt(zmq.RCVTIMEO, 10000)
t, seq, payload = sub.recv_multipart()
out["live"] = [t.decode(), int.from_bytes(seq, "big"), msgpack.unpackb(payload)]
print(json.dumps(out), flush=True)
`

func TestPythonConsumer(t *testing.T) {
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	if err := exec.Command(py, "-c", "import zmq, msgpack").Run(); err != nil {
		t.Skip("python3-zmq or python3-msgpack missing (apt-get install python3-zmq python3-msgpack; CI installs them)")
	}
	p := newPub(t, kvevents.Config{Topic: "kv@pod-a@m", DataParallelRank: 3})
	p.Do(func(emit func(kvevents.Event)) { emit(stored(7, 8)) })
	p.Flush()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-c", pyConsumer, p.Endpoint(), p.ReplayEndpoint(), p.Topic())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(stdout)
	ready, err := rd.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(rd)
	if ready != "ready\n" {
		t.Fatalf("python said %q", ready)
	}
	// The SUB may join after a message: publish until python got one.
	stop := make(chan struct{})
	go func() {
		for i := uint64(100); ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			p.Do(func(emit func(kvevents.Event)) { emit(removed(i)) })
		}
	}()
	var out struct {
		Replay [][]any
		Live   []any
	}
	err = dec.Decode(&out)
	close(stop)
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	// [[seq, [ts, [event...], 3]]...]: AllBlocksCleared, then the BlockStored.
	var evs []any
	for i, r := range out.Replay {
		b := r[1].([]any)
		if r[0].(float64) != float64(i) || len(b) != 3 || b[2].(float64) != 3 {
			t.Fatalf("replayed batch %d as python reads it: %v", i, r)
		}
		evs = append(evs, b[1].([]any)...)
	}
	if len(evs) != 2 || evs[0].([]any)[0] != "AllBlocksCleared" {
		t.Fatalf("replayed events %v", evs)
	}
	ev := evs[1].([]any)
	want := []any{"BlockStored", []any{7.0, 8.0}, nil, []any{7.0, 0.0, 0.0, 1.0, 8.0, 1.0, 0.0, 1.0}, 4.0, nil, "DISK"}
	if js, wjs := mustJSON(t, ev), mustJSON(t, want); js != wjs {
		t.Fatalf("BlockStored as python reads it: %s, want %s", js, wjs)
	}
	if out.Live[0] != "kv@pod-a@m" || out.Live[1].(float64) < float64(len(out.Replay)) {
		t.Fatalf("live message %v", out.Live)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
