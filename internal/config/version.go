package config

import (
	"runtime"
	"runtime/debug"
)

// Version describes the running binary for --version: the main module's
// version ("(devel)" for a build from a checkout), then the Go version and,
// when the build recorded one, the VCS revision, with "+dirty" for a build
// from a modified tree. It reads the build info so that no release step has
// to stamp a version in with -ldflags.
func Version() string {
	v := "(devel)"
	var rev string
	var dirty bool
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	out := v + " " + runtime.Version()
	if rev != "" {
		if dirty {
			rev += "+dirty"
		}
		out += " " + rev
	}
	return out
}
