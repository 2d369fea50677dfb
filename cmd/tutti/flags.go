package main

import (
	"flag"
	"fmt"
	"math"
	"time"
)

// flagSetCreated, when set (tests), is called with every flag set
// newFlagSet makes, so a test can walk each command's flags.
var flagSetCreated func(*flag.FlagSet)

// parseFlags parses args into fs, then checks every numeric flag given on
// the command line (checkNumericFlags). Every command parses through it, so
// no command takes a negative count, size or time as its default in silence.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := checkNumericFlags(fs); err != nil {
		fs.Usage()
		return err
	}
	return nil
}

// checkNumericFlags is the one rule for numeric flags: a value given on the
// command line must be finite and ≥ 0 (every numeric flag of tutti is a
// count, size, rate or time; where 0 means "the default" the flag's help
// says so). Flags left at their default are not checked (a default of -1
// can mean "unset"). Unsigned flags need no check: flag refuses "-3" for
// them. The error names the flag and the value.
func checkNumericFlags(fs *flag.FlagSet) error {
	var err error
	fs.Visit(func(f *flag.Flag) {
		if err != nil {
			return
		}
		g, ok := f.Value.(flag.Getter)
		if !ok {
			return
		}
		bad := false
		switch v := g.Get().(type) {
		case int:
			bad = v < 0
		case int64:
			bad = v < 0
		case float64:
			bad = v < 0 || math.IsNaN(v) || math.IsInf(v, 0)
		case time.Duration:
			bad = v < 0
		}
		if bad {
			err = fmt.Errorf("--%s %s: must be a finite number ≥ 0", f.Name, f.Value.String())
		}
	})
	return err
}
