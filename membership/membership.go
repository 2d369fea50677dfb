// Package membership registers a tutti node in etcd under a lease, as NVIDIA
// Dynamo keeps its workers (and Mooncake Store its clients): the node's key
// /tutti/nodes/<id> holds where its KV events are published, its epoch and
// its capacity; keepalives hold the lease, and when the node dies the lease
// expires and etcd deletes the key, which watchers (a router) see as a
// DELETE. It uses the official client, go.etcd.io/etcd/client/v3.
package membership

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// KeyPrefix is where nodes register.
const KeyPrefix = "/tutti/nodes/"

// Limits of a registration.
const (
	maxIDBytes     = 128
	maxRecordBytes = 4096
	MinTTL         = 2 * time.Second // etcd's smallest lease with its default election timeout
	MaxTTL         = 10 * time.Minute
	DefaultTTL     = 10 * time.Second
	// maxRegrants bounds how often a lost lease is granted anew in a row
	// before Registration.Err reports the node unregistered.
	maxRegrants = 8
)

// Key is node id's key.
func Key(id string) string { return KeyPrefix + id }

// Record is a node's value: what a router needs to follow it.
type Record struct {
	ID string `json:"id"`
	// Events and Replay are the KV event PUB and ROUTER endpoints.
	Events string `json:"events_endpoint"`
	Replay string `json:"replay_endpoint,omitempty"`
	Topic  string `json:"topic,omitempty"`
	// Epoch names the node's event stream (a restart makes a new one).
	Epoch         uint64 `json:"epoch"`
	CapacityBytes int64  `json:"capacity_bytes"`
	Medium        string `json:"medium"`
	BlockTokens   int    `json:"block_tokens,omitempty"`
}

// ErrRecord is wrapped by every Record error.
var ErrRecord = errors.New("membership: bad node record")

// Validate names the first wrong field.
func (r *Record) Validate() error {
	if r.ID == "" || len(r.ID) > maxIDBytes || strings.ContainsAny(r.ID, "/ \t\n") {
		return fmt.Errorf("%w: id %q: 1..%d bytes, no '/' or spaces", ErrRecord, r.ID, maxIDBytes)
	}
	if !strings.HasPrefix(r.Events, "tcp://") {
		return fmt.Errorf("%w: events_endpoint %q: want tcp://HOST:PORT", ErrRecord, r.Events)
	}
	if r.CapacityBytes < 0 {
		return fmt.Errorf("%w: capacity_bytes %d", ErrRecord, r.CapacityBytes)
	}
	return nil
}

// ParseRecord reads a node's value (at most maxRecordBytes of JSON) and
// validates it.
func ParseRecord(b []byte) (Record, error) {
	var r Record
	if len(b) > maxRecordBytes {
		return r, fmt.Errorf("%w: %d bytes (at most %d)", ErrRecord, len(b), maxRecordBytes)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%w: %v", ErrRecord, err)
	}
	return r, r.Validate()
}

// Dial connects to etcd (endpoints "http://HOST:PORT", comma-separated in
// ParseEndpoints); the client logs nothing.
func Dial(endpoints []string, dialTimeout time.Duration) (*clientv3.Client, error) {
	if len(endpoints) == 0 {
		return nil, errors.New("membership: no etcd endpoints")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: dialTimeout, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("membership: connecting to etcd %v: %w", endpoints, err)
	}
	return cli, nil
}

// ParseEndpoints splits --etcd's comma-separated list; a bare HOST:PORT gets
// http://.
func ParseEndpoints(s string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, fmt.Errorf("membership: --etcd %q: empty entry", s)
		}
		if !strings.Contains(p, "://") {
			p = "http://" + p
		}
		out = append(out, p)
	}
	return out, nil
}

// Registration is a node's key held under a lease.
type Registration struct {
	cli    *clientv3.Client
	rec    Record
	ttl    time.Duration
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	lease    clientv3.LeaseID
	err      error
	regrants atomic.Int64
}

// Register puts rec at Key(rec.ID) under a lease of ttl (0: DefaultTTL) and
// keeps the lease alive until Close. If the lease is lost (etcd unreachable
// longer than ttl), it grants a new one and puts the key again, at most
// maxRegrants times in a row. The key is the node's only while it lives: a
// crash lets it expire within ttl plus etcd's lease check.
func Register(cli *clientv3.Client, rec Record, ttl time.Duration) (*Registration, error) {
	if err := rec.Validate(); err != nil {
		return nil, err
	}
	if ttl == 0 {
		ttl = DefaultTTL
	}
	if ttl < MinTTL || ttl > MaxTTL {
		return nil, fmt.Errorf("membership: lease TTL %v, want [%v, %v]", ttl, MinTTL, MaxTTL)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Registration{cli: cli, rec: rec, ttl: ttl, ctx: ctx, cancel: cancel, done: make(chan struct{})}
	ka, err := r.grant()
	if err != nil {
		cancel()
		return nil, err
	}
	go r.keep(ka)
	return r, nil
}

// grant takes a new lease, puts the key under it and starts its keepalives.
func (r *Registration) grant() (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	val, err := json.Marshal(r.rec)
	if err != nil {
		return nil, fmt.Errorf("membership: encoding the record: %w", err)
	}
	ctx, cancel := context.WithTimeout(r.ctx, r.ttl)
	defer cancel()
	g, err := r.cli.Grant(ctx, int64((r.ttl+time.Second-1)/time.Second))
	if err != nil {
		return nil, fmt.Errorf("membership: granting a %v lease: %w", r.ttl, err)
	}
	if _, err := r.cli.Put(ctx, Key(r.rec.ID), string(val), clientv3.WithLease(g.ID)); err != nil {
		return nil, fmt.Errorf("membership: putting %s: %w", Key(r.rec.ID), err)
	}
	ka, err := r.cli.KeepAlive(r.ctx, g.ID)
	if err != nil {
		return nil, fmt.Errorf("membership: keeping lease %x alive: %w", g.ID, err)
	}
	r.mu.Lock()
	r.lease = g.ID
	r.mu.Unlock()
	return ka, nil
}

// keep drains keepalive answers; when the channel closes before Close (the
// lease expired or the client lost etcd), it registers anew.
func (r *Registration) keep(ka <-chan *clientv3.LeaseKeepAliveResponse) {
	defer close(r.done)
	fails := 0
	for {
		for range ka {
			fails = 0
		}
		if r.ctx.Err() != nil {
			return
		}
		var err error
		for ; fails < maxRegrants && r.ctx.Err() == nil; fails++ {
			if ka, err = r.grant(); err == nil {
				r.regrants.Add(1)
				break
			}
			select {
			case <-r.ctx.Done():
			case <-time.After(min(r.ttl, time.Duration(fails+1)*200*time.Millisecond)):
			}
		}
		if err != nil || r.ctx.Err() != nil {
			r.mu.Lock()
			if r.err == nil && err != nil {
				r.err = fmt.Errorf("membership: node %s unregistered after %d attempts: %w", r.rec.ID, fails, err)
			}
			r.mu.Unlock()
			return
		}
	}
}

// Lease is the current lease.
func (r *Registration) Lease() clientv3.LeaseID {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lease
}

// Regrants counts leases granted anew after one was lost.
func (r *Registration) Regrants() int64 { return r.regrants.Load() }

// Err is non-nil once the node gave up re-registering.
func (r *Registration) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Close stops the keepalives and revokes the lease, so the key goes at once
// rather than at expiry (bounded by the TTL; a failed revoke leaves expiry
// to etcd and is returned).
func (r *Registration) Close() error {
	lease := r.Lease()
	r.cancel()
	<-r.done
	ctx, cancel := context.WithTimeout(context.Background(), r.ttl)
	defer cancel()
	if _, err := r.cli.Revoke(ctx, lease); err != nil {
		return fmt.Errorf("membership: revoking lease %x of %s: %w", lease, r.rec.ID, err)
	}
	return nil
}

// Watch calls fn with every registered node (rec non-nil) and every node
// whose key went (rec nil): first what is registered now, then the changes,
// until ctx ends or the watch fails. A value that is not a valid Record is
// reported to bad and skipped.
func Watch(ctx context.Context, cli *clientv3.Client, fn func(id string, rec *Record), bad func(key string, err error)) error {
	get, err := cli.Get(ctx, KeyPrefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("membership: listing %s: %w", KeyPrefix, err)
	}
	for _, kv := range get.Kvs {
		deliver(string(kv.Key), kv.Value, fn, bad)
	}
	wc := cli.Watch(ctx, KeyPrefix, clientv3.WithPrefix(), clientv3.WithRev(get.Header.Revision+1))
	for resp := range wc {
		if err := resp.Err(); err != nil {
			return fmt.Errorf("membership: watching %s: %w", KeyPrefix, err)
		}
		for _, ev := range resp.Events {
			key := string(ev.Kv.Key)
			if ev.Type == clientv3.EventTypeDelete {
				fn(strings.TrimPrefix(key, KeyPrefix), nil)
				continue
			}
			deliver(key, ev.Kv.Value, fn, bad)
		}
	}
	return ctx.Err()
}

func deliver(key string, val []byte, fn func(string, *Record), bad func(string, error)) {
	rec, err := ParseRecord(val)
	if err == nil && Key(rec.ID) != key {
		err = fmt.Errorf("%w: id %q under key %q", ErrRecord, rec.ID, key)
	}
	if err != nil {
		if bad != nil {
			bad(key, err)
		}
		return
	}
	fn(rec.ID, &rec)
}
