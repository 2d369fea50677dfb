// Package kvindex is a reference consumer of tutti's (and vLLM's) KV
// events, the part of a cache-aware router that matters here: it subscribes
// to each node's PUB endpoint, keeps one prefix index per node, repairs a
// sequence gap through the node's replay endpoint, and picks the node that
// holds the longest prefix of a request's chain. It is what the tests route
// with; llm-d's indexer and Dynamo's router do the same at scale.
package kvindex

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/tutti-io/tutti/kvevents"
)

// Node is one publisher to follow.
type Node struct {
	ID             string
	Endpoint       string // PUB, tcp://HOST:PORT
	ReplayEndpoint string // ROUTER; empty: gaps are counted, not repaired
	Topic          string
}

// NodeStats is what the index saw of one node.
type NodeStats struct {
	Blocks int
	// NextSeq is the sequence number the index expects next.
	NextSeq int64
	Batches int64
	// Resets counts AllBlocksCleared events applied.
	Resets int64
	Gaps   int64 // sequence gaps seen on the live stream
	// Replays counts gap repairs answered; ReplayErrors those that failed.
	Replays, ReplayErrors int64
	// OrphanStores counts BlockStored events whose parent was not held (a
	// publisher must send parents first); UnknownRemoves, BlockRemoved of a
	// block not held.
	OrphanStores, UnknownRemoves int64
	// Stored and Removed count blocks in BlockStored and BlockRemoved events.
	Stored, Removed int64
	DecodeErrors    int64
	// HashOnlyStores counts BlockStored events without token ids.
	HashOnlyStores int64
}

// Limits of the reference consumer.
const (
	replayTimeout   = 5 * time.Second
	dialRetry       = 100 * time.Millisecond
	dialRetries     = 10 * time.Second
	maxReplayFrames = 1 << 20
)

type nodeState struct {
	n      Node
	blocks map[string]struct{}
	st     NodeStats
	cancel context.CancelFunc
	done   chan struct{}
}

// Index holds every followed node's blocks. Safe for concurrent use.
type Index struct {
	mu    sync.Mutex
	cond  sync.Cond
	nodes map[string]*nodeState
}

// New returns an empty index.
func New() *Index {
	x := &Index{nodes: map[string]*nodeState{}}
	x.cond.L = &x.mu
	return x
}

// Follow subscribes to n (replacing an earlier subscription of n.ID, whose
// blocks are dropped: a restarted node publishes its contents again).
func (x *Index) Follow(n Node) error {
	x.Drop(n.ID)
	ctx, cancel := context.WithCancel(context.Background())
	// A node registers before it binds: dialing retries for dialRetries.
	sub := zmq4.NewSub(ctx, zmq4.WithDialerRetry(dialRetry), zmq4.WithDialerMaxRetries(int(dialRetries/dialRetry)))
	if err := sub.Dial(n.Endpoint); err != nil {
		cancel()
		return fmt.Errorf("kvindex: dialing %s (%s): %w", n.ID, n.Endpoint, err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, n.Topic); err != nil {
		_ = sub.Close()
		cancel()
		return fmt.Errorf("kvindex: subscribing to %q: %w", n.Topic, err)
	}
	ns := &nodeState{n: n, blocks: map[string]struct{}{}, cancel: cancel, done: make(chan struct{})}
	x.mu.Lock()
	x.nodes[n.ID] = ns
	x.mu.Unlock()
	go x.follow(ctx, ns, sub)
	return nil
}

// Drop stops following node id and forgets its blocks (a node whose
// membership lease expired).
func (x *Index) Drop(id string) {
	x.mu.Lock()
	ns := x.nodes[id]
	delete(x.nodes, id)
	x.mu.Unlock()
	if ns != nil {
		ns.cancel()
		<-ns.done
	}
}

// Close drops every node.
func (x *Index) Close() {
	x.mu.Lock()
	var ids []string
	for id := range x.nodes {
		ids = append(ids, id)
	}
	x.mu.Unlock()
	for _, id := range ids {
		x.Drop(id)
	}
}

// pollInterval is how long a quiet stream waits before the index asks the
// replay endpoint whether it missed anything (a lost last batch is seen by no
// later sequence number).
const pollInterval = 500 * time.Millisecond

func (x *Index) follow(ctx context.Context, ns *nodeState, sub zmq4.Socket) {
	defer close(ns.done)
	msgs := make(chan zmq4.Msg, 64)
	go func() {
		defer close(msgs)
		for {
			msg, err := sub.Recv()
			if err != nil {
				return
			}
			select {
			case msgs <- msg:
			case <-ctx.Done():
				return
			}
		}
	}()
	defer func() {
		_ = sub.Close()
		for range msgs {
		}
	}()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	x.catchUp(ctx, ns) // a joining subscriber first asks for everything
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			x.catchUp(ctx, ns)
		case msg, ok := <-msgs:
			if !ok {
				return
			}
			tick.Reset(pollInterval)
			x.live(ctx, ns, msg)
		}
	}
}

// catchUp asks for every batch after the last applied one.
func (x *Index) catchUp(ctx context.Context, ns *nodeState) {
	if ns.n.ReplayEndpoint == "" {
		return
	}
	x.mu.Lock()
	next := ns.st.NextSeq
	x.mu.Unlock()
	if err := x.repair(ctx, ns, next); err != nil && ctx.Err() == nil {
		x.count(ns, func(st *NodeStats) { st.ReplayErrors++ })
	}
}

// live applies one message of the PUB stream in sequence order, repairing a
// gap first.
func (x *Index) live(ctx context.Context, ns *nodeState, msg zmq4.Msg) {
	if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
		x.count(ns, func(st *NodeStats) { st.DecodeErrors++ })
		return
	}
	seq := int64(binary.BigEndian.Uint64(msg.Frames[1]))
	b, err := kvevents.DecodeBatch(msg.Frames[2])
	if err != nil {
		x.count(ns, func(st *NodeStats) { st.DecodeErrors++ })
		return
	}
	x.mu.Lock()
	next := ns.st.NextSeq
	x.mu.Unlock()
	switch {
	case seq == next:
		x.apply(ns, seq, b)
	case seq < next:
		// Applied already (through a replay).
	default:
		x.count(ns, func(st *NodeStats) { st.Gaps++ })
		if err := x.repair(ctx, ns, next); err != nil {
			x.count(ns, func(st *NodeStats) { st.ReplayErrors++ })
			return
		}
		x.mu.Lock()
		next = ns.st.NextSeq
		x.mu.Unlock()
		if seq == next {
			x.apply(ns, seq, b)
		}
	}
}

func (x *Index) count(ns *nodeState, f func(*NodeStats)) {
	x.mu.Lock()
	f(&ns.st)
	x.cond.Broadcast()
	x.mu.Unlock()
}

// apply applies batch seq and expects seq+1 next.
func (x *Index) apply(ns *nodeState, seq int64, b kvevents.Batch) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.applyLocked(ns, seq, b)
}

func (x *Index) applyLocked(ns *nodeState, seq int64, b kvevents.Batch) {
	for _, e := range b.Events {
		switch e.Kind {
		case kvevents.AllBlocksCleared:
			clear(ns.blocks)
			ns.st.Resets++
		case kvevents.BlockStored:
			if e.HasParent {
				if _, ok := ns.blocks[e.Parent.Key()]; !ok {
					ns.st.OrphanStores++
				}
			}
			if len(e.Tokens) == 0 {
				ns.st.HashOnlyStores++
			}
			for _, h := range e.Hashes {
				ns.blocks[h.Key()] = struct{}{}
			}
			ns.st.Stored += int64(len(e.Hashes))
		case kvevents.BlockRemoved:
			for _, h := range e.Hashes {
				if _, ok := ns.blocks[h.Key()]; !ok {
					ns.st.UnknownRemoves++
				}
				delete(ns.blocks, h.Key())
			}
			ns.st.Removed += int64(len(e.Hashes))
		}
	}
	ns.st.Batches++
	ns.st.NextSeq = seq + 1
	ns.st.Blocks = len(ns.blocks)
	x.cond.Broadcast()
}

// repair asks the node's replay endpoint for everything from seq start and
// applies the answer: buffered batches, or the current contents (batches
// that all carry the last sequence number, beginning with AllBlocksCleared).
func (x *Index) repair(ctx context.Context, ns *nodeState, start int64) error {
	if ns.n.ReplayEndpoint == "" {
		return errors.New("kvindex: no replay endpoint")
	}
	ctx, cancel := context.WithTimeout(ctx, replayTimeout)
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(ns.n.ReplayEndpoint); err != nil {
		return fmt.Errorf("kvindex: dialing replay %s: %w", ns.n.ReplayEndpoint, err)
	}
	if err := d.SendMulti(zmq4.NewMsgFrom(nil, binary.BigEndian.AppendUint64(nil, uint64(start)))); err != nil {
		return fmt.Errorf("kvindex: replay request: %w", err)
	}
	type frame struct {
		seq int64
		b   kvevents.Batch
	}
	var got []frame
	for range maxReplayFrames {
		msg, err := d.Recv()
		if err != nil {
			return fmt.Errorf("kvindex: replay answer: %w", err)
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			return fmt.Errorf("kvindex: replay answer of %d frames", len(msg.Frames))
		}
		seq := int64(binary.BigEndian.Uint64(msg.Frames[1]))
		if seq == -1 {
			// The answer is applied in one step, so no reader sees half of it.
			x.mu.Lock()
			for _, f := range got {
				x.applyLocked(ns, f.seq, f.b)
			}
			ns.st.Replays++
			x.mu.Unlock()
			return nil
		}
		b, err := kvevents.DecodeBatch(msg.Frames[2])
		if err != nil {
			return fmt.Errorf("kvindex: replay batch %d: %w", seq, err)
		}
		got = append(got, frame{seq, b})
	}
	return fmt.Errorf("kvindex: replay answer longer than %d frames", maxReplayFrames)
}

// Holds reports whether node id holds block h.
func (x *Index) Holds(id string, h kvevents.Hash) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	ns := x.nodes[id]
	if ns == nil {
		return false
	}
	_, ok := ns.blocks[h.Key()]
	return ok
}

// Stats returns what the index saw of node id.
func (x *Index) Stats(id string) (NodeStats, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	ns := x.nodes[id]
	if ns == nil {
		return NodeStats{}, false
	}
	return ns.st, true
}

// WaitSeq waits until node id's batch seq was applied, or timeout.
func (x *Index) WaitSeq(id string, seq int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	t := time.AfterFunc(timeout, func() {
		x.mu.Lock()
		x.cond.Broadcast()
		x.mu.Unlock()
	})
	defer t.Stop()
	x.mu.Lock()
	defer x.mu.Unlock()
	for {
		ns := x.nodes[id]
		if ns != nil && ns.st.NextSeq > seq {
			return nil
		}
		if !time.Now().Before(deadline) {
			var next int64 = -1
			if ns != nil {
				next = ns.st.NextSeq
			}
			return fmt.Errorf("kvindex: node %s: batch %d not applied within %v (next %d)", id, seq, timeout, next)
		}
		x.cond.Wait()
	}
}

// WaitHolds waits until node id holds block h, or timeout.
func (x *Index) WaitHolds(id string, h kvevents.Hash, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	t := time.AfterFunc(timeout, func() {
		x.mu.Lock()
		x.cond.Broadcast()
		x.mu.Unlock()
	})
	defer t.Stop()
	key := h.Key()
	x.mu.Lock()
	defer x.mu.Unlock()
	for {
		if ns := x.nodes[id]; ns != nil {
			if _, ok := ns.blocks[key]; ok {
				return nil
			}
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("kvindex: node %s: block %v not held within %v", id, h, timeout)
		}
		x.cond.Wait()
	}
}

// Pick returns the node holding the longest leading run of chain and its
// length; ties go to the first node id in lexical order; "" when none holds
// chain[0].
func (x *Index) Pick(chain []kvevents.Hash) (string, int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	best, bestN := "", 0
	for id, ns := range x.nodes {
		n := 0
		for _, h := range chain {
			if _, ok := ns.blocks[h.Key()]; !ok {
				break
			}
			n++
		}
		if n > bestN || (n == bestN && n > 0 && id < best) {
			best, bestN = id, n
		}
	}
	return best, bestN
}
