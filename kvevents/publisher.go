package kvevents

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Config is what a Publisher binds and how far it buffers. Zero tuning
// fields take the defaults below.
type Config struct {
	// Engine: no sockets; the engine the store runs in takes the events
	// (Publisher.Take) and publishes them with its own (vLLM: the
	// connector's workers report them, vLLM publishes what every rank
	// holds). Endpoint, ReplayEndpoint and Topic must be empty.
	Engine bool
	// Endpoint is the PUB socket's bind address, tcp://HOST:PORT (port 0:
	// any free port; Publisher.Endpoint says which).
	Endpoint string
	// ReplayEndpoint is the ROUTER socket's bind address; empty: no replay.
	ReplayEndpoint string
	// Topic is frame 0 of every message: llm-d subscribes to
	// "kv@<pod>@<model>"; Dynamo and vLLM's own subscriber to "".
	Topic string
	// DataParallelRank is the batch's third field.
	DataParallelRank int
	// Epoch names this process's stream (sequence numbers restart at 0 in
	// each); zero: the time of New in nanoseconds.
	Epoch uint64
	// MaxQueueEvents bounds the events emitted and not yet published; past
	// it events are dropped (counted) and the stream gets a sequence gap.
	MaxQueueEvents int
	// MaxBatchEvents bounds the events of one batch.
	MaxBatchEvents int
	// ReplayBatches and ReplayBytes bound the ring of recent batches the
	// replay endpoint answers from (vLLM keeps 10,000 batches).
	ReplayBatches int
	ReplayBytes   int64
	// SendQueueBatches bounds the PUB socket's send queue (its high-water
	// mark); past it batches are dropped for every subscriber.
	SendQueueBatches int
	// SendTimeout bounds one write to one replay client.
	SendTimeout time.Duration
	// MaxTokenBytes bounds the token ids (and engine hashes) a store keeps
	// to publish with its blocks; past it blocks are published with hashes
	// only (counted by the store).
	MaxTokenBytes int64
	// Format is the events' layout (default vLLM 0.26's maps).
	Format Format
	// Medium and Locality are what a store publishes its blocks as; empty:
	// Format.Medium() and Format.Locality(). FormatVLLM011 has no locality.
	Medium, Locality string
}

// Defaults for the zero tuning fields of Config.
const (
	DefaultMaxQueueEvents   = 1 << 16
	DefaultMaxBatchEvents   = 1024
	DefaultReplayBatches    = 10000
	DefaultReplayBytes      = 64 << 20
	DefaultSendQueueBatches = 1024
	DefaultSendTimeout      = 2 * time.Second
	DefaultMaxTokenBytes    = 64 << 20
)

// ErrConfig is wrapped by every Config error.
var ErrConfig = errors.New("kvevents: invalid config")

func (c Config) withDefaults() Config {
	if c.MaxQueueEvents == 0 {
		c.MaxQueueEvents = DefaultMaxQueueEvents
	}
	if c.MaxBatchEvents == 0 {
		c.MaxBatchEvents = DefaultMaxBatchEvents
	}
	if c.ReplayBatches == 0 {
		c.ReplayBatches = DefaultReplayBatches
	}
	if c.ReplayBytes == 0 {
		c.ReplayBytes = DefaultReplayBytes
	}
	if c.SendQueueBatches == 0 {
		c.SendQueueBatches = DefaultSendQueueBatches
	}
	if c.SendTimeout == 0 {
		c.SendTimeout = DefaultSendTimeout
	}
	if c.MaxTokenBytes == 0 {
		c.MaxTokenBytes = DefaultMaxTokenBytes
	}
	if c.Epoch == 0 {
		c.Epoch = uint64(time.Now().UnixNano())
	}
	c.Medium = c.PublishedMedium()
	if c.Locality == "" {
		c.Locality = c.Format.Locality()
	}
	return c
}

// PublishedMedium is the medium a store publishes its blocks as: Medium,
// or the format's (Format.Medium).
func (c Config) PublishedMedium() string {
	if c.Medium != "" {
		return c.Medium
	}
	return c.Format.Medium()
}

// Validate names the first wrong field.
func (c Config) Validate() error {
	if c.Engine {
		if c.Endpoint != "" || c.ReplayEndpoint != "" || c.Topic != "" || c.DataParallelRank != 0 {
			return fmt.Errorf("%w: Engine with an endpoint, topic or rank (the engine publishes)", ErrConfig)
		}
	} else if !strings.HasPrefix(c.Endpoint, "tcp://") {
		return fmt.Errorf("%w: Endpoint %q: want tcp://HOST:PORT", ErrConfig, c.Endpoint)
	}
	if int(c.Format) >= len(formatNames) {
		return fmt.Errorf("%w: %v", ErrConfig, c.Format)
	}
	if len(c.Medium) > maxMediumBytes {
		return fmt.Errorf("%w: Medium of %d bytes (at most %d)", ErrConfig, len(c.Medium), maxMediumBytes)
	}
	switch {
	case c.Locality != "" && c.Format == FormatVLLM011:
		return fmt.Errorf("%w: Locality %q: format %v has no locality", ErrConfig, c.Locality, c.Format)
	case c.Locality != "" && c.Locality != LocalityLocal && c.Locality != LocalityRemote:
		return fmt.Errorf("%w: Locality %q: want LOCAL or REMOTE (vLLM's Locality)", ErrConfig, c.Locality)
	}
	if c.ReplayEndpoint != "" && !strings.HasPrefix(c.ReplayEndpoint, "tcp://") {
		return fmt.Errorf("%w: ReplayEndpoint %q: want tcp://HOST:PORT", ErrConfig, c.ReplayEndpoint)
	}
	if len(c.Topic) > maxStringBytes {
		return fmt.Errorf("%w: Topic of %d bytes (at most %d)", ErrConfig, len(c.Topic), maxStringBytes)
	}
	for _, f := range []struct {
		name      string
		v, lo, hi int64
	}{
		{"MaxQueueEvents", int64(c.MaxQueueEvents), 0, 1 << 24},
		{"MaxBatchEvents", int64(c.MaxBatchEvents), 0, MaxBatchEvents},
		{"ReplayBatches", int64(c.ReplayBatches), 0, 1 << 20},
		{"ReplayBytes", c.ReplayBytes, 0, 1 << 34},
		{"SendQueueBatches", int64(c.SendQueueBatches), 0, 1 << 20},
		{"SendTimeout", int64(c.SendTimeout), 0, int64(time.Minute)},
		{"MaxTokenBytes", c.MaxTokenBytes, 0, 1 << 40},
	} {
		if f.v < f.lo || f.v > f.hi {
			return fmt.Errorf("%w: %s = %d, want [%d, %d] (0: default)", ErrConfig, f.name, f.v, f.lo, f.hi)
		}
	}
	return nil
}

// Contents lists what the store serves now, as BlockStored events whose
// parents come before their children, by calling emit. It is called with
// the Publisher's order held (no Do runs meanwhile) and must not call Do.
type Contents func(emit func(Event))

// Stats counts what a Publisher did. With Config.Engine, Batches counts the
// Takes that took events, and Gaps the contents listings that replaced
// dropped events.
type Stats struct {
	Epoch            uint64 `json:"epoch"`
	LastSeq          int64  `json:"last_seq"` // -1 before the first batch
	Batches          int64  `json:"batches"`
	Events           int64  `json:"events"`
	DroppedEvents    int64  `json:"dropped_events"` // past MaxQueueEvents
	Gaps             int64  `json:"gaps"`           // sequence numbers skipped for dropped events
	SendErrors       int64  `json:"send_errors"`
	ReplaysBuffered  int64  `json:"replays_buffered"` // replay requests answered from the ring
	ReplaysContents  int64  `json:"replays_contents"` // replay requests answered with the current contents
	ReplayErrors     int64  `json:"replay_errors"`    // malformed requests or failed replies
	QueuedEvents     int    `json:"queued_events"`    // emitted, not yet published
	ReplayRingBytes  int64  `json:"replay_ring_bytes"`
	ReplayRingLength int    `json:"replay_ring_length"`
}

// Publisher publishes a store's KV events. Do is safe for concurrent use
// and never waits on the network.
type Publisher struct {
	cfg    Config
	pub    zmq4.Socket
	router zmq4.Socket
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	wake   chan struct{}

	mu       sync.Mutex // the order: Do, cutting batches, taking contents
	pending  []Event
	gap      bool
	resync   bool // Engine: the next Take lists the contents first
	nextSeq  int64
	contents Contents
	closed   bool

	sendMu sync.Mutex // held from a cut until its batches are sent, so PUB order is seq order
	ring   ring

	st struct {
		batches, events, dropped, gaps, sendErrs atomic.Int64
		replBuf, replContents, replErrs          atomic.Int64
	}
}

// New binds the endpoints and publishes AllBlocksCleared as batch 0: a
// subscriber drops whatever it held of an earlier epoch of this node. With
// Config.Engine it binds nothing and starts nothing: see Take.
func New(cfg Config) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{cfg: cfg, ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1)}
	if cfg.Engine {
		p.resync = true
		return p, nil
	}
	p.ring.maxBatches, p.ring.maxBytes = cfg.ReplayBatches, cfg.ReplayBytes
	p.pub = zmq4.NewPub(ctx, zmq4.WithTimeout(cfg.SendTimeout))
	if err := p.pub.SetOption(zmq4.OptionHWM, cfg.SendQueueBatches); err != nil {
		cancel()
		return nil, fmt.Errorf("kvevents: PUB high-water mark: %w", err)
	}
	if err := p.pub.Listen(cfg.Endpoint); err != nil {
		_ = p.pub.Close()
		cancel()
		return nil, fmt.Errorf("kvevents: binding PUB %s: %w", cfg.Endpoint, err)
	}
	if cfg.ReplayEndpoint != "" {
		p.router = zmq4.NewRouter(ctx, zmq4.WithTimeout(cfg.SendTimeout))
		if err := p.router.Listen(cfg.ReplayEndpoint); err != nil {
			_ = p.pub.Close()
			_ = p.router.Close()
			cancel()
			return nil, fmt.Errorf("kvevents: binding ROUTER %s: %w", cfg.ReplayEndpoint, err)
		}
		p.wg.Add(1)
		go p.serveReplay()
	}
	p.Do(func(emit func(Event)) { emit(Event{Kind: AllBlocksCleared}) })
	p.wg.Add(1)
	go p.run()
	return p, nil
}

// Endpoint is the PUB socket's address (with the port a port 0 bound);
// empty with Config.Engine.
func (p *Publisher) Endpoint() string {
	if p.pub == nil {
		return ""
	}
	return "tcp://" + p.pub.Addr().String()
}

// ReplayEndpoint is the ROUTER socket's address; empty without replay.
func (p *Publisher) ReplayEndpoint() string {
	if p.router == nil {
		return ""
	}
	return "tcp://" + p.router.Addr().String()
}

// Epoch names this process's stream.
func (p *Publisher) Epoch() uint64 { return p.cfg.Epoch }

// Config returns the configuration in use (defaults filled in).
func (p *Publisher) Config() Config { return p.cfg }

// Topic is frame 0 of every message.
func (p *Publisher) Topic() string { return p.cfg.Topic }

// SetContents gives the replay endpoint the store's current contents;
// without it a gap older than the ring is answered with AllBlocksCleared only.
func (p *Publisher) SetContents(c Contents) {
	p.mu.Lock()
	p.contents = c
	p.mu.Unlock()
}

// Do runs fn, which changes what the store serves and reports each change
// through emit, as one step of the stream's order: no other Do, cut or
// contents listing interleaves. emit takes ownership of the event's slices
// and never blocks: past MaxQueueEvents the event is dropped and counted.
// fn must not call Do. After Close, fn still runs and its events are dropped.
func (p *Publisher) Do(fn func(emit func(Event))) {
	p.mu.Lock()
	fn(p.emitLocked)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *Publisher) emitLocked(e Event) {
	if p.cfg.Engine {
		p.emitEngineLocked(e)
		return
	}
	if p.closed || len(p.pending) >= p.cfg.MaxQueueEvents {
		p.st.dropped.Add(1)
		p.gap = !p.closed
		return
	}
	p.pending = append(p.pending, e)
}

// run publishes what Do queued, as it comes: batches form while a send runs.
func (p *Publisher) run() {
	defer p.wg.Done()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-p.wake:
		}
		p.mu.Lock()
		cut := p.cutLocked()
		p.mu.Unlock()
		p.send(cut)
	}
}

// seqBatch is one batch cut from the queue with its sequence number.
type seqBatch struct {
	seq    int64
	events []Event
}

// cutLocked takes every queued event as batches of at most MaxBatchEvents
// and numbers them; a drop since the last cut skips one number first. It
// takes sendMu, which the caller's send releases, so batches leave in order.
func (p *Publisher) cutLocked() []seqBatch {
	p.sendMu.Lock()
	if p.gap {
		p.gap = false
		p.nextSeq++
		p.st.gaps.Add(1)
	}
	var out []seqBatch
	for len(p.pending) > 0 {
		n := min(len(p.pending), p.cfg.MaxBatchEvents)
		out = append(out, seqBatch{seq: p.nextSeq, events: p.pending[:n:n]})
		p.nextSeq++
		p.pending = p.pending[n:]
	}
	p.pending = nil
	return out
}

// send encodes and publishes cut batches and keeps them in the ring, then
// releases sendMu (taken by cutLocked).
func (p *Publisher) send(cut []seqBatch) {
	defer p.sendMu.Unlock()
	topic := []byte(p.cfg.Topic)
	for _, b := range cut {
		payload := AppendBatch(nil, &Batch{TS: nowSeconds(), Events: b.events, DataParallelRank: p.cfg.DataParallelRank, Format: p.cfg.Format})
		if err := p.pub.SendMulti(zmq4.NewMsgFrom(topic, seqBytes(b.seq), payload)); err != nil {
			p.st.sendErrs.Add(1)
		}
		p.ring.push(b.seq, payload)
		p.st.batches.Add(1)
		p.st.events.Add(int64(len(b.events)))
	}
}

func nowSeconds() float64 { return float64(time.Now().UnixNano()) / 1e9 }

// Flush publishes what is queued now and returns once it was handed to the
// PUB socket (nothing with Config.Engine: the engine takes the events).
func (p *Publisher) Flush() {
	if p.cfg.Engine {
		return
	}
	p.mu.Lock()
	cut := p.cutLocked()
	p.mu.Unlock()
	p.send(cut)
}

// Stats returns the counters.
func (p *Publisher) Stats() Stats {
	p.mu.Lock()
	st := Stats{Epoch: p.cfg.Epoch, QueuedEvents: len(p.pending)}
	p.mu.Unlock()
	p.sendMu.Lock()
	st.LastSeq = p.ring.lastSeq()
	st.ReplayRingBytes, st.ReplayRingLength = p.ring.bytes, len(p.ring.b)
	p.sendMu.Unlock()
	st.Batches, st.Events = p.st.batches.Load(), p.st.events.Load()
	st.DroppedEvents, st.Gaps, st.SendErrors = p.st.dropped.Load(), p.st.gaps.Load(), p.st.sendErrs.Load()
	st.ReplaysBuffered, st.ReplaysContents, st.ReplayErrors = p.st.replBuf.Load(), p.st.replContents.Load(), p.st.replErrs.Load()
	return st
}

// Close publishes what is queued, then closes the sockets. Later Do calls
// run their fn and drop its events.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	if p.cfg.Engine {
		p.closed, p.pending = true, nil
		p.mu.Unlock()
		p.cancel()
		return nil
	}
	cut := p.cutLocked()
	p.closed = true
	p.mu.Unlock()
	p.send(cut)
	p.cancel()
	errs := []error{ignoreClosed(p.pub.Close())}
	if p.router != nil {
		errs = append(errs, ignoreClosed(p.router.Close()))
	}
	p.wg.Wait()
	return errors.Join(errs...)
}

// ignoreClosed drops the error of closing a connection the library's own
// reader closed a moment earlier (the cancelled context stops both).
func ignoreClosed(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
