// Command tutti is the command-line front of the tutti runtime: device
// measurement (devbench), store checks (fsck), trace replay and evaluation
// (replay, resweep), a store serving KV events (node), and the GPU benchmark
// (gpubench, gpubench-pool). README.md's CLI table lists each, one row per
// command (TestReadmeListsEveryCommand).
//
// Each subcommand lives in its own file and registers itself in init, so the
// owners of the packages behind them do not edit a shared switch.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"golang.org/x/term"
)

// command is one subcommand. run gets the arguments after the subcommand name
// and writes normal output to stdout; it returns an error to print and exit 1,
// or an exitError to exit with a chosen status.
type command struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{}

func register(name, summary string, run func(args []string, stdout, stderr io.Writer) error) {
	if _, dup := commands[name]; dup {
		panic("tutti: subcommand registered twice: " + name)
	}
	commands[name] = command{summary: summary, run: run}
}

// exitError carries a non-zero exit status without printing anything more
// (the subcommand has already reported, e.g. fsck finding corruption).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: tutti <command> [flags]")
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-14s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nrun 'tutti <command> -h' for a command's flags")
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "tutti: unknown command %q\n", args[0])
		usage(stderr)
		return 2
	}
	err := cmd.run(args[1:], stdout, stderr)
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ee):
		return ee.code
	default:
		fmt.Fprintf(stderr, "tutti %s: %v\n", args[0], err)
		return 1
	}
}

// newFlagSet returns a flag set that reports errors instead of exiting, so
// subcommands stay testable. Commands parse it with parseFlags.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("tutti "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	if flagSetCreated != nil {
		flagSetCreated(fs)
	}
	return fs
}

// signalContext is the context of a long command: cancelled by the first
// SIGINT or SIGTERM, after which the command runs its normal cleanup path
// (its test files and temporary stores removed) and returns interrupted's
// error. Only the first signal is caught: a second one kills the process
// as usual. stop releases the signals.
func signalContext(stderr io.Writer) (ctx context.Context, interrupted func(error) error, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	var mu sync.Mutex
	var got os.Signal
	go func() {
		select {
		case s := <-ch:
			mu.Lock()
			got = s
			mu.Unlock()
			signal.Stop(ch)
			cancel()
		case <-ctx.Done():
		}
	}()
	interrupted = func(err error) error {
		mu.Lock()
		defer mu.Unlock()
		if got == nil {
			return err
		}
		code := 130
		if s, ok := got.(syscall.Signal); ok {
			code = 128 + int(s)
		}
		fmt.Fprintf(stderr, "tutti: interrupted by %v (%v); cleaned up\n", got, err)
		return exitError{code: code}
	}
	return ctx, interrupted, func() { signal.Stop(ch); cancel() }
}

// checkOutDir makes sure dir exists (creating it) and takes a file before any
// work is done, so a bad --out fails in a second instead of after the run.
func checkOutDir(flagName, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("%s %s: %w", flagName, dir, err)
	}
	f, err := os.CreateTemp(dir, ".tutti-write-check-")
	if err != nil {
		return fmt.Errorf("%s %s: not writable: %w", flagName, dir, err)
	}
	f.Close()
	return os.Remove(f.Name())
}

// checkOutFile makes sure path can be created (its directory exists and is
// writable) before any work is done; an existing file is left as it is.
func checkOutFile(flagName, path string) error {
	if err := checkOutDir(flagName+" "+path+": directory", filepath.Dir(path)); err != nil {
		return err
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return fmt.Errorf("%s %s: is a directory", flagName, path)
	}
	return nil
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progressEvery is the least time between two progress lines.
const progressEvery = 5 * time.Second

// lineProgress prints progress as whole lines (for a pipe or a CI log,
// where a bar redrawn with \r shows nothing until the end): one line when a
// phase starts and when it ends, with the elapsed time, and in between at
// most one every progressEvery. Safe for concurrent use.
type lineProgress struct {
	w       io.Writer
	started time.Time
	mu      sync.Mutex
	phase   string
	last    time.Time
}

func newLineProgress(w io.Writer) *lineProgress {
	return &lineProgress{w: w, started: time.Now()}
}

// Update reports done of total in phase.
func (p *lineProgress) Update(phase string, done, total int) { p.Note(phase, done, total, "") }

// Note is Update with a detail appended to the line (the last result).
func (p *lineProgress) Note(phase string, done, total int, detail string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	first := phase != p.phase
	if !first && done < total && now.Sub(p.last) < progressEvery {
		return
	}
	p.phase, p.last = phase, now
	if detail != "" {
		detail = " " + detail
	}
	fmt.Fprintf(p.w, "[%7.1fs] %s: %d/%d%s\n", now.Sub(p.started).Seconds(), phase, done, total, detail)
}
