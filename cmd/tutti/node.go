package main

// tutti node: one store on its own directories that publishes what it
// serves as KV events (and registers in etcd), driven line by line on stdin
// as an engine drives the runtime: save and load requests given as token
// ids. It is what the router tests run twice on one machine, and a way to
// try a router against tutti without an engine.

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/internal/kvdata"
	"github.com/tutti-io/tutti/kvevents"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/membership"
	"github.com/tutti-io/tutti/prefix"
	"github.com/tutti-io/tutti/runtime"
)

func init() {
	register("node", "a store that publishes KV events for routers, driven by save/load lines on stdin", runNode)
}

// Limits of tutti node's input.
const (
	nodeMaxLineBytes = 1 << 20
	nodeMaxPages     = 1 << 20
	nodeChainSeed    = 0 // prefix.ChainFromTokens seed: the router derives the same ids
)

// kvFlags are the flags replay and node share: where to publish and where to
// register.
type kvFlags struct {
	events, etcd, id string
	ttl              time.Duration
}

func (k *kvFlags) add(fs *flag.FlagSet) {
	fs.StringVar(&k.events, "kv-events", "", "publish what the store serves as vLLM KV events: tcp://HOST:PORT[?replay=tcp://HOST:PORT&topic=kv@POD@MODEL&format=vllm-0.26|vllm-0.11], HOST the node's routable address (bound and advertised; a wildcard is refused; docs/routers.md)")
	fs.StringVar(&k.etcd, "etcd", "", "register the node at /tutti/nodes/<id> in etcd (comma-separated endpoints) under a lease kept alive while it runs; needs --kv-events")
	fs.StringVar(&k.id, "node-id", "", "the node's id in etcd (default: the host name)")
	fs.DurationVar(&k.ttl, "etcd-ttl", membership.DefaultTTL, "the registration's lease TTL: a killed node's key is gone within it plus etcd's slack")
}

// config parses --kv-events (nil without it) and checks the pair.
func (k *kvFlags) config() (*kvevents.Config, error) {
	if k.events == "" {
		if k.etcd != "" {
			return nil, errors.New("--etcd needs --kv-events (the record says where the events are)")
		}
		return nil, nil
	}
	c, err := kvevents.ParseSpec(k.events)
	if err != nil {
		return nil, fmt.Errorf("--kv-events: %w", err)
	}
	if c.Engine {
		return nil, errors.New("--kv-events engine: nothing here takes the events; give an endpoint")
	}
	for _, ep := range []string{c.Endpoint, c.ReplayEndpoint} {
		if err := advertisable(ep); err != nil {
			return nil, fmt.Errorf("--kv-events: %w", err)
		}
	}
	if c.Epoch == 0 {
		c.Epoch = uint64(time.Now().UnixNano())
	}
	return &c, nil
}

// advertisable refuses an endpoint that binds every address: an endpoint is
// both where the node binds and what it advertises (the ready line, the etcd
// record), and a router cannot connect to a wildcard. "" (no replay
// endpoint) passes.
func advertisable(ep string) error {
	if ep == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
	if err != nil {
		return fmt.Errorf("endpoint %q: %v", ep, err)
	}
	if ip := net.ParseIP(host); host == "" || host == "*" || ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("endpoint %q binds every address, and the endpoint is what the node advertises: give the node's routable address (docs/routers.md)", ep)
	}
	return nil
}

// register puts the node's record in etcd; nil, nil without --etcd.
func (k *kvFlags) register(ev *kvevents.Config, capacityBytes int64, blockTokens int) (*membership.Registration, func(), error) {
	if k.etcd == "" {
		return nil, func() {}, nil
	}
	eps, err := membership.ParseEndpoints(k.etcd)
	if err != nil {
		return nil, nil, err
	}
	id := k.id
	if id == "" {
		if id, err = os.Hostname(); err != nil {
			return nil, nil, fmt.Errorf("--node-id not given and no host name: %w", err)
		}
	}
	cli, err := membership.Dial(eps, 5*time.Second)
	if err != nil {
		return nil, nil, err
	}
	reg, err := membership.Register(cli, membership.Record{ID: id, Events: ev.Endpoint, Replay: ev.ReplayEndpoint, Topic: ev.Topic,
		Epoch: ev.Epoch, CapacityBytes: capacityBytes, Medium: ev.PublishedMedium(), BlockTokens: blockTokens}, k.ttl)
	if err != nil {
		cli.Close()
		return nil, nil, err
	}
	return reg, func() { _ = reg.Close(); cli.Close() }, nil
}

type nodeReply struct {
	Op       string `json:"op"`
	Error    string `json:"error,omitempty"`
	Blocks   int    `json:"blocks,omitempty"`   // chain blocks of the request
	Saved    int    `json:"saved,omitempty"`    // save: blocks committed
	Cached   int    `json:"cached,omitempty"`   // load: blocks found
	Loaded   int    `json:"loaded,omitempty"`   // load: blocks restored
	Verified *bool  `json:"verified,omitempty"` // load: every restored byte is the block's own
	// ready
	ID        string `json:"id,omitempty"`
	Events    string `json:"events,omitempty"`
	Replay    string `json:"replay,omitempty"`
	Epoch     uint64 `json:"epoch,omitempty"`
	Recovered int    `json:"recovered_blocks,omitempty"`
	Lease     int64  `json:"lease,omitempty"`
	// stats: the store's, nested as runtime.Stats's json tags name them
	Stats *runtime.Stats `json:"stats,omitempty"`
}

func runNode(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("node", stderr)
	var dirs dirsFlag
	fs.Var(&dirs, "dir", "store directory, or several comma-separated or repeated; kept: a restarted node recovers them")
	modelName := fs.String("model", "tiny", "model profile: "+strings.Join(model.Names(), ", "))
	capBlocks := fs.Int("capacity-blocks", 1024, "store capacity in chain blocks")
	pages := fs.Int("pages", 256, "engine KV pages (host memory), at least one chain block of the model; a request may use all of them")
	var kf kvFlags
	kf.add(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if len(dirs.dirs) == 0 {
		return usageErr(fs.Usage, errors.New("--dir: required"))
	}
	prof, err := model.Lookup(*modelName)
	if err != nil {
		return usageErr(fs.Usage, err)
	}
	ev, err := kf.config()
	if err != nil {
		return usageErr(fs.Usage, err)
	}
	g := prof.Shape
	if *capBlocks < 1 {
		return usageErr(fs.Usage, fmt.Errorf("--capacity-blocks %d: want >= 1", *capBlocks))
	}
	// A request holds whole chain blocks: fewer pages than one block would
	// fail every save and load.
	if *pages < g.ChunkPages || *pages > nodeMaxPages {
		return usageErr(fs.Usage, fmt.Errorf("--pages %d: want %d..%d (one chain block of model %s is %d pages)",
			*pages, g.ChunkPages, nodeMaxPages, prof.Name, g.ChunkPages))
	}
	cfg := runtime.Config{Dirs: dirs.dirs, CapacityBytes: runtime.CapacityForBlocksOn(g, *capBlocks, len(dirs.dirs)), Geometry: g,
		Layout: kvshape.LayoutPerLayer, NumPages: *pages, KVEvents: ev}
	s, err := runtime.Open(cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	kv, err := runtime.AllocHostKV(g, cfg.Layout, cfg.NumPages)
	if err != nil {
		return err
	}
	defer kv.Free()
	if err := s.RegisterKV(kv.Memory()); err != nil {
		return err
	}
	reg, unregister, err := kf.register(ev, cfg.CapacityBytes, g.ChunkPages*g.PageTokens)
	if err != nil {
		return err
	}
	defer unregister()
	out := json.NewEncoder(stdout)
	ready := nodeReply{Op: "ready", Recovered: s.Recovery().IndexedBlocks}
	if ev := s.Stats().Events; ev.Enabled {
		ready.Events, ready.Replay, ready.Epoch = ev.Endpoint, ev.ReplayEndpoint, ev.Epoch
	}
	if reg != nil {
		ready.Lease = int64(reg.Lease())
	}
	ready.ID = kf.id
	if err := out.Encode(ready); err != nil {
		return err
	}
	n := &node{s: s, kv: kv, g: g}
	lines := make(chan nodeLine)
	readErr := make(chan error, 1)
	go func() {
		defer close(lines)
		br := bufio.NewReaderSize(os.Stdin, 64<<10)
		for {
			l, err := readNodeLine(br, nodeMaxLineBytes)
			if err != nil {
				if !errors.Is(err, io.EOF) {
					readErr <- fmt.Errorf("reading stdin: %w", err)
				}
				return
			}
			lines <- l
		}
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	for {
		select {
		case <-sig:
			return nil
		case l, ok := <-lines:
			if !ok {
				select {
				case err := <-readErr:
					return err
				default:
					return nil
				}
			}
			var r nodeReply
			switch {
			case l.over > 0:
				r.Error = fmt.Sprintf("line of %d bytes, longer than the %d-byte limit: skipped", l.over, nodeMaxLineBytes)
			case strings.TrimSpace(l.text) == "":
				continue
			default:
				r = n.do(l.text)
			}
			if err := out.Encode(r); err != nil {
				return err
			}
		}
	}
}

// nodeLine is one line of stdin: its text, or (over > 0) the length of a
// line past the limit, which was read to its end and dropped.
type nodeLine struct {
	text string
	over int64
}

// readNodeLine reads the next line of br (its newline, or the end of the
// input, ends it). A line longer than limit bytes is consumed in full but not
// kept, so the lines after it are read as lines and memory stays bounded.
// It returns io.EOF only when no byte is left.
func readNodeLine(br *bufio.Reader, limit int) (nodeLine, error) {
	var buf []byte
	var n int64
	for {
		frag, err := br.ReadSlice('\n')
		n += int64(len(frag))
		if n <= int64(limit)+1 { // +1: the newline
			buf = append(buf, frag...)
		} else {
			buf = nil
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && n == 0:
			return nodeLine{}, io.EOF
		case err != nil && !errors.Is(err, io.EOF):
			return nodeLine{}, err
		}
		if len(frag) > 0 && frag[len(frag)-1] == '\n' {
			n--
		}
		if n > int64(limit) {
			return nodeLine{over: n}, nil
		}
		return nodeLine{text: strings.TrimSuffix(string(buf), "\n")}, nil
	}
}

// node runs one request at a time; its pages are [0, blocks*ChunkPages).
type node struct {
	s  *runtime.Store
	kv *runtime.HostKV
	g  kvshape.Geometry
}

func (n *node) do(line string) nodeReply {
	f := strings.Fields(line)
	r := nodeReply{Op: f[0]}
	switch f[0] {
	case "stats":
		st := n.s.Stats()
		r.Stats = &st
		return r
	case "save", "load":
	default:
		r.Error = fmt.Sprintf("unknown op %q (save TOKENS..., load TOKENS..., stats)", f[0])
		return r
	}
	tokens := make([]uint32, 0, len(f)-1)
	for _, t := range f[1:] {
		v, err := strconv.ParseUint(t, 10, 32)
		if err != nil {
			r.Error = fmt.Sprintf("token %q: %v", t, err)
			return r
		}
		tokens = append(tokens, uint32(v))
	}
	bt := n.g.ChunkPages * n.g.PageTokens
	chain, err := prefix.ChainFromTokens(nil, tokens, bt, nodeChainSeed)
	if err == nil && (len(chain) == 0 || len(chain)*n.g.ChunkPages > n.s.Config().NumPages) {
		err = fmt.Errorf("%d tokens make %d blocks of %d; want 1..%d blocks", len(tokens), len(chain), bt, n.s.Config().NumPages/n.g.ChunkPages)
	}
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.Blocks = len(chain)
	pages := make([]int32, len(chain)*n.g.ChunkPages)
	for i := range pages {
		pages[i] = int32(i)
	}
	if f[0] == "save" {
		n.fill(chain, pages, false)
		meta := make([]runtime.BlockMeta, len(chain))
		for i := range meta {
			meta[i].Tokens = tokens[i*bt : (i+1)*bt]
		}
		sv, err := n.s.SaveWithMeta(chain, pages, meta)
		if err != nil {
			r.Error = err.Error()
			return r
		}
		sv.Wait()
		r.Saved, r.Cached = sv.Saved(), sv.Skipped(runtime.SkipCached)
		return r
	}
	n.fill(chain, pages, true)
	l, err := n.s.Load(chain, pages)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	if err := l.Wait(); err != nil {
		r.Error = err.Error()
	}
	r.Cached, r.Loaded = l.Cached(), l.Blocks()
	ok := n.verify(chain[:r.Loaded], pages)
	r.Verified = &ok
	return r
}

// fill writes each block's own bytes into its pages (scramble: bytes no
// block has, so a page a load does not restore shows).
func (n *node) fill(chain []uint64, pages []int32, scramble bool) {
	for i, id := range chain {
		for j := range n.g.ChunkPages {
			for l := range n.g.Layers {
				for pl := range n.g.Planes {
					b := n.kv.Page(l, pl, pages[i*n.g.ChunkPages+j])
					if scramble {
						clear(b)
						continue
					}
					kvdata.Fill(b, kvdata.Key{Block: id, Layer: l, Plane: pl, Page: j})
				}
			}
		}
	}
}

func (n *node) verify(chain []uint64, pages []int32) bool {
	for i, id := range chain {
		for j := range n.g.ChunkPages {
			for l := range n.g.Layers {
				for pl := range n.g.Planes {
					if kvdata.Verify(n.kv.Page(l, pl, pages[i*n.g.ChunkPages+j]), kvdata.Key{Block: id, Layer: l, Plane: pl, Page: j}) >= 0 {
						return false
					}
				}
			}
		}
	}
	return true
}
