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

// TestPythonConsumer: python3-zmq and python3-msgpack read the stream and
// its replay, in each format: vLLM 0.26's maps by default, 0.11's arrays.
func TestPythonConsumer(t *testing.T) {
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	if err := exec.Command(py, "-c", "import zmq, msgpack").Run(); err != nil {
		t.Skip("python3-zmq or python3-msgpack missing (apt-get install python3-zmq python3-msgpack; CI installs them)")
	}
	toks := []any{7.0, 0.0, 0.0, 1.0, 8.0, 1.0, 0.0, 1.0}
	for _, c := range []struct {
		format  kvevents.Format
		cleared any
		stored  any
	}{
		{kvevents.FormatVLLM026, map[string]any{"type": "AllBlocksCleared"}, map[string]any{
			"type": "BlockStored", "block_hashes": []any{7.0, 8.0}, "parent_block_hash": nil, "token_ids": toks,
			"block_size": 4.0, "lora_id": nil, "medium": "FS", "lora_name": nil, "group_idx": 0.0, "locality": "LOCAL"}},
		{kvevents.FormatVLLM011, []any{"AllBlocksCleared"},
			[]any{"BlockStored", []any{7.0, 8.0}, nil, toks, 4.0, nil, "FS"}},
	} {
		t.Run(c.format.String(), func(t *testing.T) {
			replayed, live := pythonReads(t, py, kvevents.Config{Topic: "kv@pod-a@m", DataParallelRank: 3, Format: c.format})
			// [[seq, [ts, [event...], 3]]...]: AllBlocksCleared, then the BlockStored.
			var evs []any
			for i, r := range replayed {
				b := r[1].([]any)
				if r[0].(float64) != float64(i) || len(b) != 3 || b[2].(float64) != 3 {
					t.Fatalf("replayed batch %d as python reads it: %v", i, r)
				}
				evs = append(evs, b[1].([]any)...)
			}
			if js, wjs := mustJSON(t, evs), mustJSON(t, []any{c.cleared, c.stored}); js != wjs {
				t.Fatalf("events as python reads them:\n %s\nwant %s", js, wjs)
			}
			if live[0] != "kv@pod-a@m" || live[1].(float64) < float64(len(replayed)) {
				t.Fatalf("live message %v", live)
			}
		})
	}
}

// pythonReads publishes stored(7, 8) and has pyConsumer replay from seq 0
// and read one live message; it returns what python decoded.
func pythonReads(t *testing.T, py string, cfg kvevents.Config) (replayed [][]any, live []any) {
	p := newPub(t, cfg)
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
	return out.Replay, out.Live
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
