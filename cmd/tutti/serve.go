package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
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
	capBlocks := fs.Int("capacity-blocks", 1024, "store capacity in chain blocks")
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
	cfg := serveConfig(dirs.dirs, g, *capBlocks)
	cfg.KVEvents = ev
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
