// Package envdoc lists the environment variables a configuration struct
// reads, the way github.com/kelseyhightower/envconfig reads them, so that
// the reference in docs/configuration.md and the compose file's check can
// follow the binaries' real configuration instead of a copy.
package envdoc

import (
	"bytes"
	"fmt"
	"sort"
	"strings"

	"github.com/kelseyhightower/envconfig"
)

// Var is one variable of a configuration.
type Var struct {
	Name     string // as read, with the prefix: HARVEST_SHARDS
	Type     string // as envconfig names it: String, Duration, True or False, ...
	Default  string
	Required bool
	Desc     string
}

const format = "{{range .}}{{usage_key .}}\x1f{{usage_type .}}\x1f{{usage_default .}}\x1f{{usage_required .}}\x1f{{usage_description .}}\x1e{{end}}"

// Vars returns the variables specs read with prefix, sorted by name; a
// variable read by two specs is listed once (the first spec's entry).
func Vars(prefix string, specs ...any) ([]Var, error) {
	seen := map[string]bool{}
	var out []Var
	for _, spec := range specs {
		var b bytes.Buffer
		if err := envconfig.Usagef(prefix, spec, &b, format); err != nil {
			return nil, fmt.Errorf("envdoc: %T: %w", spec, err)
		}
		for rec := range strings.SplitSeq(b.String(), "\x1e") {
			if rec == "" {
				continue
			}
			f := strings.Split(rec, "\x1f")
			if len(f) != 5 {
				return nil, fmt.Errorf("envdoc: %T: unexpected usage record %q", spec, rec)
			}
			if seen[f[0]] {
				// Keep the first entry, but take a description it lacks.
				for i := range out {
					if out[i].Name == f[0] && out[i].Desc == "" {
						out[i].Desc = f[4]
					}
				}
				continue
			}
			seen[f[0]] = true
			out = append(out, Var{Name: f[0], Type: f[1], Default: f[2], Required: f[3] == "true", Desc: f[4]})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Names returns the names of vars as a set.
func Names(vars []Var) map[string]bool {
	m := make(map[string]bool, len(vars))
	for _, v := range vars {
		m[v.Name] = true
	}
	return m
}

// Markdown renders vars as a Markdown table: variable, default,
// description.
func Markdown(vars []Var) string {
	var b strings.Builder
	b.WriteString("| variable | type | default | meaning |\n| --- | --- | --- | --- |\n")
	for _, v := range vars {
		def := "—"
		if v.Default != "" {
			def = "`" + v.Default + "`"
		}
		if v.Required {
			def = "required"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", v.Name, typeName(v.Type), def,
			strings.ReplaceAll(v.Desc, "|", `\|`))
	}
	return b.String()
}

func typeName(t string) string {
	switch t {
	case "True or False":
		return "bool"
	case "Comma-separated list of String:Float pairs":
		return "map"
	}
	return strings.ToLower(t)
}
