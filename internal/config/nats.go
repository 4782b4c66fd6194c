package config

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// natsSchemes are the URL schemes nats.go dials; a URL without one is
// taken as nats://.
var natsSchemes = map[string]bool{"nats": true, "tls": true, "ws": true, "wss": true}

// NATSURLs splits a HARVEST_NATS_URL value into its server URLs, in the
// order given, with the blanks around each trimmed. One URL is a list of
// one; the servers of a cluster are listed comma-separated.
func NATSURLs(v string) []string {
	if strings.TrimSpace(v) == "" {
		return nil
	}
	parts := strings.Split(v, ",")
	for i, p := range parts {
		parts[i] = strings.TrimSpace(p)
	}
	return parts
}

// ValidateNATSURL checks a HARVEST_NATS_URL value: at least one URL, and
// each a nats://, tls://, ws:// or wss:// URL (or a bare host:port) with a
// host. Errors name the variable and the position of the URL at fault,
// with any password hidden.
func ValidateNATSURL(v string) error {
	urls := NATSURLs(v)
	if len(urls) == 0 {
		return errors.New("HARVEST_NATS_URL: empty: give the NATS server's URL, or the comma-separated URLs of a cluster's servers")
	}
	for i, raw := range urls {
		where := fmt.Sprintf("HARVEST_NATS_URL: server %d of %d", i+1, len(urls))
		if raw == "" {
			return fmt.Errorf("%s is empty (two commas in a row, or one at an end)", where)
		}
		full, shown := raw, Redact(raw)
		if !strings.Contains(full, "://") {
			full = "nats://" + full
			shown = strings.TrimPrefix(Redact(full), "nats://")
		}
		u, err := url.Parse(full)
		if err != nil {
			// url.Parse quotes the input in its error: say it without.
			return fmt.Errorf("%s is not a URL", where)
		}
		if !natsSchemes[u.Scheme] {
			return fmt.Errorf("%s: %q: scheme %q (want nats, tls, ws or wss)", where, shown, u.Scheme)
		}
		if u.Hostname() == "" {
			return fmt.Errorf("%s: %q names no host", where, shown)
		}
	}
	return nil
}
