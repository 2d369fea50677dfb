// Command tutti is the command-line front of the tutti runtime: device
// measurement (devbench), store checks (fsck), trace replay and evaluation
// (replay), and the GPU benchmark (gpubench).
//
// Each subcommand lives in its own file and registers itself in init, so the
// owners of the packages behind them do not edit a shared switch.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
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
