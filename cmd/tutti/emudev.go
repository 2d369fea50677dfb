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

	"github.com/tutti-io/tutti/eval/emudev"
)

func init() {
	register("emudev", "emulated storage that holds still: RAM-backed files served through FUSE, each paced as one device of a fixed rate (loop devices go over them)", runEmudev)
}

// emudevReply is a line of emudev's output: "ready" once every device is
// served, "stats" at exit.
type emudevReply struct {
	Op      string               `json:"op"`
	Paths   []string             `json:"paths,omitempty"`
	Devices []emudev.DeviceStats `json:"devices,omitempty"`
}

func runEmudev(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("emudev", stderr)
	backing := fs.String("backing", "", "comma-separated backing files, one per device (on tmpfs, written whole: scripts/emuloop.sh's emu_backing)")
	mount := fs.String("mount", "", "directory for the mounts: device i is served as MOUNT/i/disk")
	readBps := fs.Int64("read-bytes-per-sec", 1_500_000_000, "every device's read rate (0: unpaced)")
	writeBps := fs.Int64("write-bytes-per-sec", 1_500_000_000, "every device's write rate (0: unpaced)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *backing == "" || *mount == "" {
		return usageErr(fs.Usage, errors.New("--backing and --mount: required"))
	}
	if *readBps < 0 || *writeBps < 0 {
		return usageErr(fs.Usage, fmt.Errorf("--read-bytes-per-sec %d, --write-bytes-per-sec %d: want >= 0", *readBps, *writeBps))
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	e, err := emudev.Start(emudev.Config{Backing: strings.Split(*backing, ","), MountDir: *mount,
		ReadBytesPerSec: *readBps, WriteBytesPerSec: *writeBps})
	if err != nil {
		return err
	}
	out := json.NewEncoder(stdout)
	if err := out.Encode(emudevReply{Op: "ready", Paths: e.Paths()}); err != nil {
		return errors.Join(err, e.Close())
	}
	<-sig
	st := e.Stats()
	cerr := e.Close()
	return errors.Join(cerr, out.Encode(emudevReply{Op: "stats", Devices: st}))
}
