package natsconn

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/harvest-run/harvest/internal/config"
)

// The settings every Harvest connection gets.
const (
	// ReconnectWait is the pause before a server the connection has just
	// tried is tried again. The other servers of the list are tried first,
	// without a pause, so losing one node of a cluster costs no wait.
	ReconnectWait = time.Second
	// ReconnectJitter is the most each such pause is lengthened at random
	// (ReconnectJitterTLS over TLS, whose handshakes cost the server
	// more), so that the clients of a node that went away do not all
	// knock on the others at the same instant.
	ReconnectJitter    = time.Second
	ReconnectJitterTLS = 2 * time.Second
	// PingInterval is how often a connection asks its server for an
	// answer; after MaxPingsOut unanswered pings it counts the server as
	// gone and reconnects. A server that stopped answering without closing
	// the connection (its machine died, the network was cut) is thus
	// noticed within about PingInterval × (MaxPingsOut + 1) = 15s; nats.go's
	// defaults (2 minutes, 2 pings) would take up to six minutes.
	PingInterval = 5 * time.Second
	MaxPingsOut  = 2
	// DialTimeout bounds one attempt to connect to one server.
	DialTimeout = 2 * time.Second
)

// Options describe one connection.
type Options struct {
	// Name identifies the connection to the server (its /connz lists it)
	// and in logs, such as "harvest-gateway".
	Name string
	// Logger, when set, gets a line when the connection is made, lost and
	// made again, and the server's asynchronous errors (a slow consumer, a
	// permissions violation); nil leaves nats.go's default, which prints
	// the errors on stderr.
	Logger *slog.Logger
	// Meanwhile says what the process does while it has no server, for the
	// warning logged when the connection is lost, such as "NATS starts
	// pause".
	Meanwhile string
	// FailFast makes Connect fail when no server of the list answers: for
	// a command that does one thing and exits, or a process whose server
	// was started just before (harvest dev). Without it Connect returns at
	// once and the connection is made in the background, which lets a
	// service start before NATS does.
	FailFast bool
}

// Servers splits a HARVEST_NATS_URL value into its servers, dropping empty
// entries (config.ValidateNATSURL refuses them; nats.go ignores them).
func Servers(urls string) []string {
	var out []string
	for _, u := range config.NATSURLs(urls) {
		if u != "" {
			out = append(out, u)
		}
	}
	return out
}

// Settings returns the nats.Options that Connect dials urls with: every
// server of the list, the settings above, and then extra, which may
// override them (a command's shorter dial timeout, say).
func Settings(urls string, o Options, extra ...nats.Option) (nats.Options, error) {
	opts := nats.GetDefaultOptions()
	opts.Servers = Servers(urls)
	if len(opts.Servers) == 0 {
		return opts, errors.New("natsconn: no NATS server URL")
	}
	for _, opt := range append(o.options(), extra...) {
		if err := opt(&opts); err != nil {
			return opts, fmt.Errorf("natsconn: %w", err)
		}
	}
	return opts, nil
}

// Connect connects to the servers of urls, a HARVEST_NATS_URL value (one
// URL, or several comma-separated), with Settings.
func Connect(urls string, o Options, extra ...nats.Option) (*nats.Conn, error) {
	opts, err := Settings(urls, o, extra...)
	if err != nil {
		return nil, err
	}
	nc, err := opts.Connect()
	if err != nil {
		return nil, fmt.Errorf("natsconn: connect to %s: %w", redactList(opts.Servers), err)
	}
	return nc, nil
}

func (o Options) options() []nats.Option {
	opts := []nats.Option{
		nats.Name(o.Name),
		// For as long as the process lives: a fleet must come back by
		// itself after any NATS outage, however long.
		nats.MaxReconnects(-1),
		nats.ReconnectWait(ReconnectWait),
		nats.ReconnectJitter(ReconnectJitter, ReconnectJitterTLS),
		nats.PingInterval(PingInterval),
		nats.MaxPingsOutstanding(MaxPingsOut),
		nats.Timeout(DialTimeout),
		nats.RetryOnFailedConnect(!o.FailFast),
	}
	log := o.Logger
	if log == nil {
		return opts
	}
	meanwhile := o.Meanwhile
	if meanwhile == "" {
		meanwhile = "messages wait in the reconnect buffer"
	}
	return append(opts,
		nats.ConnectHandler(func(c *nats.Conn) {
			log.Info("NATS connected", "url", c.ConnectedUrlRedacted(), "servers", len(c.Servers()))
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn("NATS disconnected: "+meanwhile+" until it is back", "err", err)
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info("NATS reconnected", "url", c.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			log.Warn("NATS error", "subject", subject, "err", err)
		}),
	)
}

// redactList hides the passwords of a list of server URLs.
func redactList(urls []string) string {
	out := make([]string, len(urls))
	for i, u := range urls {
		out[i] = config.Redact(u)
	}
	return strings.Join(out, ",")
}
