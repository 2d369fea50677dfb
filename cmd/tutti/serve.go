package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
)

func init() {
	register("serve", "one node-local store service that the node's engines share through a unix socket", runServe)
}

// serveReply is a line of tutti serve's output: ready, then stats at exit.
type serveReply struct {
	Op        string                `json:"op"`
	Socket    string                `json:"socket,omitempty"`
	Recovered int                   `json:"recovered_blocks"`
	Events    string                `json:"events,omitempty"`
	Lease     int64                 `json:"lease,omitempty"`
	Service   *runtime.ServiceStats `json:"service,omitempty"`
	Stats     *runtime.Stats        `json:"stats,omitempty"`
}

// serveConfig is the store config of the serve flags: the service moves
// no bytes itself, so its staging is the smallest.
func serveConfig(dirs []string, g kvshape.Geometry, capBlocks int) runtime.Config {
	return runtime.Config{Dirs: dirs, CapacityBytes: runtime.CapacityForBlocks(g, capBlocks), Geometry: g,
		Layout: kvshape.LayoutPerLayer, NumPages: g.ChunkPages, StagingBytes: 2 << 20, StagingSlotBytes: 1 << 20, QueueDepth: 4}
}

func runServe(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", stderr)
	var dirs dirsFlag
	fs.Var(&dirs, "dir", "store directory, or several comma-separated or repeated (one per device); a directory another process holds is refused")
	socket := fs.String("socket", "", "the unix socket engines connect to (runtime.Connect, tutti_connect, tutti.Store(connect=...)); a stale one is replaced")
	modelName := fs.String("model", "tiny", "model profile (the engines' KV shape): "+strings.Join(model.Names(), ", "))
	geoSpec := fs.String("geometry", "", "the engines' KV shape instead of --model's: layers=L,kv_heads=H,head_dim=D,dtype=bf16|fp16|fp8|fp32,planes=2|1,page_tokens=T,chunk_pages=P (a vLLM engine's, as its connector logs it)")
	capBlocks := fs.Int("capacity-blocks", 1024, "store capacity in chain blocks")
	noPrewrite := fs.Bool("no-prewrite", false, "do not prewrite the pool in the background (runtime.Config.NoPrewrite): for benchmarks that must not share the devices with it")
	var kf kvFlags
	kf.add(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if len(dirs.dirs) == 0 || *socket == "" {
		return usageErr(fs.Usage, errors.New("--dir and --socket: required"))
	}
	prof, err := model.Lookup(*modelName)
	if err != nil {
		return usageErr(fs.Usage, err)
	}
	if *capBlocks < 1 {
		return usageErr(fs.Usage, fmt.Errorf("--capacity-blocks %d: want >= 1", *capBlocks))
	}
	ev, err := kf.config()
	if err != nil {
		return usageErr(fs.Usage, err)
	}
	g := prof.Shape
	if *geoSpec != "" {
		if g, err = parseGeometry(*geoSpec); err != nil {
			return usageErr(fs.Usage, fmt.Errorf("--geometry: %w", err))
		}
	}
	cfg := serveConfig(dirs.dirs, g, *capBlocks)
	cfg.KVEvents, cfg.NoPrewrite = ev, *noPrewrite
	// Signals first: a TERM between the ready line and Notify would kill
	// the service without its Close.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	v, err := runtime.Serve(cfg, *socket)
	if err != nil {
		return err
	}
	// KV events and etcd membership are the service's: published once per
	// node, whatever number of engines save through it.
	reg, unregister, err := kf.register(ev, cfg.CapacityBytes, g.ChunkPages*g.PageTokens)
	if err != nil {
		_ = v.Close()
		return err
	}
	defer unregister()
	out := json.NewEncoder(stdout)
	ready := serveReply{Op: "ready", Socket: v.Socket(), Recovered: v.Store().Recovery().IndexedBlocks}
	if e := v.Store().Stats().Events; e.Enabled {
		ready.Events = e.Endpoint
	}
	if reg != nil {
		ready.Lease = int64(reg.Lease())
	}
	if err := out.Encode(ready); err != nil {
		_ = v.Close()
		return err
	}
	<-sig
	st, vs := v.Store().Stats(), v.Stats()
	cerr := v.Close()
	return errors.Join(cerr, out.Encode(serveReply{Op: "stats", Service: &vs, Stats: &st}))
}

// parseGeometry reads --geometry's key=value list; every key is required.
func parseGeometry(spec string) (kvshape.Geometry, error) {
	var g kvshape.Geometry
	ints := map[string]*int{"layers": &g.Layers, "kv_heads": &g.KVHeads, "head_dim": &g.HeadDim, "planes": &g.Planes,
		"page_tokens": &g.PageTokens, "chunk_pages": &g.ChunkPages}
	seen := map[string]bool{}
	for _, kv := range strings.Split(spec, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || seen[k] {
			return g, fmt.Errorf("%q: want key=value, each key once", kv)
		}
		seen[k] = true
		if k == "dtype" {
			d, err := kvshape.ParseDType(v)
			if err != nil {
				return g, err
			}
			g.DType = d
			continue
		}
		p := ints[k]
		if p == nil {
			return g, fmt.Errorf("unknown key %q (want layers, kv_heads, head_dim, dtype, planes, page_tokens, chunk_pages)", k)
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return g, fmt.Errorf("%s=%q: %w", k, v, err)
		}
		*p = n
	}
	if len(seen) != len(ints)+1 {
		return g, fmt.Errorf("%q: want all of layers, kv_heads, head_dim, dtype, planes, page_tokens, chunk_pages", spec)
	}
	return g, g.Validate()
}
