package kvevents_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/tutti-io/tutti/kvevents"
	"github.com/tutti-io/tutti/kvevents/kvindex"
)

const waitFor = 10 * time.Second

func newPub(t *testing.T, cfg kvevents.Config) *kvevents.Publisher {
	t.Helper()
	if cfg.Endpoint == "" {
		cfg.Endpoint = "tcp://127.0.0.1:0"
	}
	if cfg.ReplayEndpoint == "" {
		cfg.ReplayEndpoint = "tcp://127.0.0.1:0"
	}
	p, err := kvevents.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func follow(t *testing.T, x *kvindex.Index, id string, p *kvevents.Publisher) {
	t.Helper()
	if err := x.Follow(kvindex.Node{ID: id, Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(), Topic: p.Topic()}); err != nil {
		t.Fatal(err)
	}
}

func stored(ids ...uint64) kvevents.Event {
	e := kvevents.Event{Kind: kvevents.BlockStored, BlockSize: 4, Medium: kvevents.MediumFS, Locality: kvevents.LocalityLocal, HasGroupIdx: true}
	for i, id := range ids {
		e.Hashes = append(e.Hashes, kvevents.IntHash(id))
		e.Tokens = append(e.Tokens, uint32(id), uint32(i), 0, 1)
	}
	return e
}

func removed(ids ...uint64) kvevents.Event {
	e := kvevents.Event{Kind: kvevents.BlockRemoved, Medium: kvevents.MediumFS, Locality: kvevents.LocalityLocal, HasGroupIdx: true}
	for _, id := range ids {
		e.Hashes = append(e.Hashes, kvevents.IntHash(id))
	}
	return e
}

// contents is a tiny store: a set of ids, changed and listed in the
// publisher's order.
type contents struct {
	mu  sync.Mutex
	ids map[uint64]bool
}

func (c *contents) list(emit func(kvevents.Event)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range c.ids {
		emit(stored(id))
	}
}

func (c *contents) store(p *kvevents.Publisher, id uint64) {
	p.Do(func(emit func(kvevents.Event)) {
		c.mu.Lock()
		c.ids[id] = true
		c.mu.Unlock()
		emit(stored(id))
	})
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []kvevents.Config{
		{Endpoint: "127.0.0.1:5557"},
		{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "ipc:///x"},
		{Endpoint: "tcp://127.0.0.1:0", MaxBatchEvents: kvevents.MaxBatchEvents + 1},
		{Endpoint: "tcp://127.0.0.1:0", MaxQueueEvents: -1},
	} {
		if err := c.Validate(); !errors.Is(err, kvevents.ErrConfig) {
			t.Errorf("%+v: %v, want ErrConfig", c, err)
		}
	}
}

// A subscriber that joins late gets the batches it missed from the ring;
// one that joins after the ring moved on gets the current contents.
func TestLateSubscriberRepairs(t *testing.T) {
	for _, tc := range []struct {
		name         string
		ring         int
		wantContents bool
	}{{"ring", 0, false}, {"contents", 2, true}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPub(t, kvevents.Config{ReplayBatches: tc.ring, Topic: "kv@pod@m"})
			c := &contents{ids: map[uint64]bool{}}
			p.SetContents(c.list)
			for id := uint64(1); id <= 20; id++ {
				c.store(p, id)
				p.Flush()
			}
			p.Do(func(emit func(kvevents.Event)) {
				c.mu.Lock()
				delete(c.ids, 20)
				c.mu.Unlock()
				emit(removed(20))
			})
			p.Flush()
			x := kvindex.New()
			defer x.Close()
			follow(t, x, "a", p)
			last := p.Stats().LastSeq
			if err := x.WaitSeq("a", last, waitFor); err != nil {
				t.Fatal(err)
			}
			for id := uint64(1); id <= 20; id++ {
				if got := x.Holds("a", kvevents.IntHash(id)); got != (id != 20) {
					t.Errorf("block %d held %v", id, got)
				}
			}
			st, _ := x.Stats("a")
			ps := p.Stats()
			if st.Replays == 0 || (ps.ReplaysContents > 0) != tc.wantContents {
				t.Fatalf("subscriber %+v, publisher %+v", st, ps)
			}
			if st.OrphanStores != 0 {
				t.Fatalf("%d stores before their parent", st.OrphanStores)
			}
			// Live batches follow the repair.
			c.store(p, 99)
			p.Flush()
			if err := x.WaitSeq("a", p.Stats().LastSeq, waitFor); err != nil {
				t.Fatal(err)
			}
			if !x.Holds("a", kvevents.IntHash(99)) {
				t.Fatal("live block 99 not held")
			}
		})
	}
}

// Past MaxQueueEvents events are dropped, counted, and the stream skips a
// sequence number, so a subscriber repairs from the contents.
func TestDropsLeaveAGap(t *testing.T) {
	p := newPub(t, kvevents.Config{MaxQueueEvents: 8, ReplayBatches: 4})
	c := &contents{ids: map[uint64]bool{}}
	p.SetContents(c.list)
	x := kvindex.New()
	defer x.Close()
	follow(t, x, "a", p)
	if err := x.WaitSeq("a", 0, waitFor); err != nil {
		t.Fatal(err)
	}
	p.Do(func(emit func(kvevents.Event)) {
		for id := uint64(1); id <= 20; id++ {
			c.ids[id] = true
			emit(stored(id))
		}
	})
	p.Flush()
	c.store(p, 21)
	p.Flush()
	ps := p.Stats()
	if ps.DroppedEvents != 12 || ps.Gaps != 1 {
		t.Fatalf("dropped %d, gaps %d; want 12, 1", ps.DroppedEvents, ps.Gaps)
	}
	if err := x.WaitSeq("a", ps.LastSeq, waitFor); err != nil {
		t.Fatal(err)
	}
	for id := uint64(1); id <= 21; id++ {
		if !x.Holds("a", kvevents.IntHash(id)) {
			t.Fatalf("block %d not held after the repair", id)
		}
	}
}

// A subscriber that never reads (its TCP buffers fill) does not hold up Do.
func TestSlowSubscriberNeverBlocks(t *testing.T) {
	p := newPub(t, kvevents.Config{SendQueueBatches: 4, MaxQueueEvents: 1 << 10})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.Dial(p.Endpoint()); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		big := make([]uint64, 512)
		for i := range 2000 {
			for j := range big {
				big[j] = uint64(i*len(big) + j + 1)
			}
			p.Do(func(emit func(kvevents.Event)) { emit(stored(big...)) })
		}
	}()
	// A blocked Do never returns; a slow one (the race detector on a loaded
	// 2-core machine encodes these 9 MB in seconds) does: the bound is wide.
	select {
	case <-done:
	case <-time.After(8 * waitFor):
		t.Fatal("Do blocked behind a subscriber that does not read")
	}
	p.Flush()
	if st := p.Stats(); st.Batches == 0 {
		t.Fatalf("nothing published: %+v", st)
	}
}

// Close returns while a subscriber that does not read is connected.
func TestCloseWithStuckSubscriber(t *testing.T) {
	p, err := kvevents.New(kvevents.Config{Endpoint: "tcp://127.0.0.1:0", SendQueueBatches: 4})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.Dial(p.Endpoint()); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	big := make([]uint64, 4096)
	for i := range 200 {
		for j := range big {
			big[j] = uint64(i*len(big) + j + 1)
		}
		p.Do(func(emit func(kvevents.Event)) { emit(stored(big...)) })
		p.Flush()
	}
	done := make(chan error)
	go func() { done <- p.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(waitFor):
		t.Fatal("Close hung behind a subscriber that does not read")
	}
}
