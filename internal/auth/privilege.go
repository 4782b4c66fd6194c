package auth

import (
	"fmt"
	"strings"
)

// Privilege names one thing a token may do at the gateway.
type Privilege string

// The privileges a token can hold. The two config privileges are reserved
// for administrator tokens (tokens without a tenant).
const (
	// RunsStart allows starting runs (one or a batch) and cancelling them.
	RunsStart Privilege = "runs:start"
	// RunsRead allows reading runs, listing them and reading usage.
	RunsRead Privilege = "runs:read"
	// WeightsRead allows reading weight overrides, quotas and key figures.
	WeightsRead Privilege = "weights:read"
	// WeightsWrite allows setting and clearing weight overrides and quotas.
	WeightsWrite Privilege = "weights:write"
	// ConfigRead allows reading the admission settings and the audit log.
	ConfigRead Privilege = "config:read"
	// ConfigWrite allows changing the admission settings.
	ConfigWrite Privilege = "config:write"
)

// allPrivileges fixes the order of the privileges and their bit in
// Privileges.
var allPrivileges = [...]Privilege{RunsStart, RunsRead, WeightsRead, WeightsWrite, ConfigRead, ConfigWrite}

// AllPrivileges returns every known privilege, in a fixed order.
func AllPrivileges() []Privilege {
	out := make([]Privilege, len(allPrivileges))
	copy(out, allPrivileges[:])
	return out
}

// ParsePrivilege turns a name such as "runs:start" into a Privilege. The
// match is exact (case-sensitive); the error quotes the bad value and lists
// the known names.
func ParsePrivilege(s string) (Privilege, error) {
	p := Privilege(s)
	if p.bit() == 0 {
		names := make([]string, len(allPrivileges))
		for i, q := range allPrivileges {
			names[i] = string(q)
		}
		return "", fmt.Errorf("unknown privilege %q (known: %s)", s, strings.Join(names, ", "))
	}
	return p, nil
}

// Valid reports whether p is one of the known privileges.
func (p Privilege) Valid() bool { return p.bit() != 0 }

// AdminOnly reports whether p may be held only by administrator tokens.
func (p Privilege) AdminOnly() bool { return p == ConfigRead || p == ConfigWrite }

// String returns the privilege's name.
func (p Privilege) String() string { return string(p) }

func (p Privilege) bit() Privileges {
	for i, q := range allPrivileges {
		if p == q {
			return 1 << i
		}
	}
	return 0
}

// Privileges is a set of privileges. The zero value is the empty set. It is
// a small value type: copy it freely and compare it with ==.
type Privileges uint8

// NewPrivileges returns the set holding ps. Unknown privileges are left out;
// use ParsePrivilege to reject them.
func NewPrivileges(ps ...Privilege) Privileges {
	var s Privileges
	for _, p := range ps {
		s |= p.bit()
	}
	return s
}

// Has reports whether p is in the set. An unknown privilege is never in it.
func (s Privileges) Has(p Privilege) bool {
	b := p.bit()
	return b != 0 && s&b == b
}

// List returns the privileges in the set, in the order of AllPrivileges.
func (s Privileges) List() []Privilege {
	var out []Privilege
	for i, p := range allPrivileges {
		if s&(1<<i) != 0 {
			out = append(out, p)
		}
	}
	return out
}

// String lists the set's privileges separated by commas.
func (s Privileges) String() string {
	var b strings.Builder
	for i, p := range s.List() {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(string(p))
	}
	return b.String()
}
