package main

import (
	"errors"
	"fmt"

	"github.com/tutti-io/tutti/eval/harness"
	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/runtime"
)

// kvEventsBackend gives --kv-events to the replay's one tutti backend (a
// publisher binds its endpoints, so two stores cannot share them) and
// registers the node in etcd for the run with --etcd. The returned func
// unregisters.
func kvEventsBackend(kf *kvFlags, bs []harness.Backend, prof model.Profile, capBlocks int, notes *[]string) (func(), error) {
	ev, err := kf.config()
	if err != nil || ev == nil {
		return func() {}, err
	}
	var t *harness.Tutti
	for _, b := range bs {
		if tb, ok := b.(*harness.Tutti); ok {
			if t != nil {
				return nil, errors.New("--kv-events: name one tutti backend with --backends (each would bind the same endpoints)")
			}
			t = tb
		}
	}
	if t == nil {
		return nil, errors.New("--kv-events: no tutti backend in the run (tutti-cpu or tutti-gpu; not with --gpus > 1)")
	}
	t.SetKVEvents(ev)
	g := prof.Shape
	var capBytes int64 // 0: sized by the run to every distinct block
	if capBlocks > 0 {
		capBytes = runtime.CapacityForBlocks(g, capBlocks)
	}
	_, unregister, err := kf.register(ev, capBytes, g.ChunkPages*g.PageTokens)
	if err != nil {
		return nil, err
	}
	*notes = append(*notes, fmt.Sprintf("%s: KV events on %s (replay %q, topic %q, epoch %d); the trace has hash ids only, so blocks are published without token ids",
		t.Name(), ev.Endpoint, ev.ReplayEndpoint, ev.Topic, ev.Epoch))
	if kf.etcd != "" {
		*notes = append(*notes, fmt.Sprintf("registered in etcd %s under a %v lease", kf.etcd, kf.ttl))
	}
	return unregister, nil
}

// kvEventsNotes reports what each publishing backend published.
func kvEventsNotes(bs []harness.Backend) []string {
	var out []string
	for _, b := range bs {
		t, ok := b.(*harness.Tutti)
		if !ok || t.KVEventsStats() == nil {
			continue
		}
		st := t.KVEventsStats()
		out = append(out, fmt.Sprintf("%s: published %d KV event batches (%d events, %d dropped, %d hashes-only blocks)",
			t.Name(), st.Batches, st.Events, st.DroppedEvents, st.HashOnlyBlocks))
	}
	return out
}
