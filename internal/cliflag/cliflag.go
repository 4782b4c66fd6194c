// Package cliflag is the flag handling the project's commands share: a
// flag set whose mistakes become usage errors (exit code 2), for the
// harvest CLI and the tools' harvest-bench.
package cliflag

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// UsageError marks a mistake in the command line; a command exits with
// code 2 on it.
type UsageError struct{ Msg string }

func (e UsageError) Error() string { return e.Msg }

// New makes the flag set of command name of program prog; its usage line
// is "usage: prog usage", then the flags, on stderr.
func New(stderr io.Writer, prog, name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet(prog+" "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: %s %s\n", prog, usage)
		fs.PrintDefaults()
	}
	return fs
}

// Parse parses args, turning a bad flag or a stray argument into a
// UsageError; -h gives flag.ErrHelp.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return UsageError{Msg: err.Error()}
	}
	if fs.NArg() > 0 {
		return UsageError{Msg: fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	return nil
}
