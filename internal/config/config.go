package config

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/kelseyhightower/envconfig"
)

// Prefix is the environment prefix of every Harvest variable.
const Prefix = "HARVEST"

// Shards is the list of shard URLs, in shard order, as HARVEST_SHARDS gives
// them. The index of a URL is the shard's number everywhere in Harvest.
type Shards []string

// Decode parses a comma-separated list; blanks around commas are trimmed.
// It lets envconfig read HARVEST_SHARDS. A URL may itself hold commas, in
// its list of hosts (postgres://u@a:5432,b:5432/db): a part that does not
// begin with postgres:// or postgresql:// continues the URL before it.
func (s *Shards) Decode(v string) error {
	*s = nil
	if strings.TrimSpace(v) == "" {
		return nil
	}
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		if n := len(*s); n > 0 && part != "" && !strings.HasPrefix(part, "postgres://") && !strings.HasPrefix(part, "postgresql://") {
			(*s)[n-1] += "," + part
			continue
		}
		*s = append(*s, part)
	}
	return nil
}

// Validate checks that every shard URL parses as a Postgres URL.
func (s Shards) Validate() error {
	if len(s) == 0 {
		return errors.New("HARVEST_SHARDS: empty: list the shard Postgres URLs, comma-separated")
	}
	for i, raw := range s {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
			return fmt.Errorf("HARVEST_SHARDS: shard %d: %q is not a postgres:// URL", i, Redact(raw))
		}
	}
	return nil
}

// Redact hides the password of a URL so it can be logged or printed.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// Common holds the variables every binary reads.
type Common struct {
	Shards  Shards `envconfig:"SHARDS" desc:"comma-separated Postgres URLs of the shards, in shard order; a URL may name a primary and its standbys (postgres://u@a:5432,b:5432/db), and the connection goes to whichever takes writes (docs/operations.md)"`
	NATSURL string `envconfig:"NATS_URL" default:"nats://127.0.0.1:4222" desc:"NATS server URL, or the comma-separated URLs of a cluster's servers (a process connects to one of them and moves to another when it goes away)"`
}

// Load fills spec from the environment with the HARVEST_ prefix; a value that
// does not parse is reported with the variable's name.
func Load(spec any) error {
	if err := envconfig.Process(Prefix, spec); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return nil
}

// Validate checks the shared settings.
func (c Common) Validate() error {
	if err := c.Shards.Validate(); err != nil {
		return err
	}
	return ValidateNATSURL(c.NATSURL)
}
