package config

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/kelseyhightower/envconfig"
)

// Exit codes shared by the binaries.
const (
	ExitOK    = 0
	ExitError = 1
	ExitUsage = 2
)

// Validator is a configuration that can check itself, naming the variable
// at fault.
type Validator interface {
	Validate() error
}

// Binary describes a Harvest binary that takes no arguments: everything
// comes from HARVEST_ variables, listed by its --help.
type Binary struct {
	// Name prefixes every message, e.g. "gateway".
	Name string
	// Intro is the help text above the table of variables.
	Intro string
}

// Usage writes the intro and every variable spec reads, with its default
// and description.
func (b Binary) Usage(w io.Writer, spec any) {
	fmt.Fprint(w, b.Intro)
	fmt.Fprint(w, "\nEnvironment:\n")
	tw := tabwriter.NewWriter(w, 1, 0, 2, ' ', 0)
	_ = envconfig.Usagef(Prefix, spec, tw, envconfig.DefaultTableFormat)
	_ = tw.Flush()
}

// Start handles the command line, loads cfg from the environment and sets
// the garbage collector's target (TuneGC). It returns ok when the binary
// should run; otherwise code is the exit code
// (help or --version shown, a stray argument, or a variable that does not parse or
// validate, whose name the message on stderr gives).
func (b Binary) Start(args []string, stdout, stderr io.Writer, cfg Validator) (code int, ok bool) {
	if len(args) > 0 {
		switch args[0] {
		case "-h", "-help", "--help", "help":
			b.Usage(stdout, cfg)
			return ExitOK, false
		case "-version", "--version", "version":
			fmt.Fprintf(stdout, "%s %s\n", b.Name, Version())
			return ExitOK, false
		}
		fmt.Fprintf(stderr, "%s: unexpected argument %q: it is configured by the environment\n\n", b.Name, args[0])
		b.Usage(stderr, cfg)
		return ExitUsage, false
	}
	if err := Load(cfg); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", b.Name, err)
		return ExitUsage, false
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", b.Name, err)
		return ExitUsage, false
	}
	TuneGC()
	return ExitOK, true
}
