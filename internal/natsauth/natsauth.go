package natsauth

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/pkg/dispatch"
)

// InboxPrefix is the reply-inbox prefix of a tenant's NATS clients:
// "_INBOX_" followed by the tenant name. A tenant user may subscribe only
// under it, so a client must be set up with
// nats.CustomInboxPrefix(InboxPrefix(tenant)) for its requests to get
// answers. The tenant is expected to be valid (auth.ValidateTenant).
func InboxPrefix(tenant string) string { return "_INBOX_" + tenant }

// OwnInbox reports whether a reply subject lies under the tenant's inbox
// prefix. A gateway can use it to refuse a request from tenant T that asks
// for its answer to be sent somewhere other than T's own inbox.
func OwnInbox(tenant, reply string) bool {
	return strings.HasPrefix(reply, InboxPrefix(tenant)+".") && len(reply) > len(InboxPrefix(tenant))+1
}

type passwordKind uint8

const (
	noPassword passwordKind = iota
	plainPassword
	bcryptPassword
	envPassword
)

// Password is how a user's password appears in the generated file: in
// clear, as a bcrypt hash, or as a reference to an environment variable
// that the server reads when it loads the file. Build one with Plain,
// Bcrypt or Env; the zero value is no password and is refused.
type Password struct {
	kind  passwordKind
	value string
}

// Plain writes the password in clear, which is fine for development. It
// must not look like a bcrypt hash, or the server would take it for one.
func Plain(password string) Password { return Password{plainPassword, password} }

// Bcrypt writes a bcrypt hash of the password (such as "$2a$11$…"); the
// server checks clients against the hash, so the file holds no secret.
// Make one with `nats server passwd` or golang.org/x/crypto/bcrypt.
func Bcrypt(hash string) Password { return Password{bcryptPassword, hash} }

// Env writes a reference to the environment variable name (upper-case
// letters, digits and '_'), resolved by the server when it loads the
// file; a missing variable stops the server from starting. The server
// parses the variable's value as a configuration value, so keep it to a
// bcrypt hash or a password that starts with a letter and has only
// letters, digits, '_' and '-' (others, such as spaces, commas or an
// all-digit value, are misread or refused).
func Env(name string) Password { return Password{envPassword, name} }

var (
	bcryptRe  = regexp.MustCompile(`^\$2[abxy]\$\d{2}\$[./A-Za-z0-9]{53}$`)
	looksHash = regexp.MustCompile(`^\$2[abxy]\$\d{2}\$`) // what the server treats as bcrypt
	envNameRe = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`)
	userRe    = regexp.MustCompile(`^[A-Za-z0-9_.@-]{1,128}$`)
	prefixRe  = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)
)

func (p Password) render() (string, error) {
	switch p.kind {
	case plainPassword:
		if p.value == "" {
			return "", errors.New("empty plain password")
		}
		if looksHash.MatchString(p.value) {
			return "", errors.New("plain password looks like a bcrypt hash (the server would treat it as one); use Bcrypt")
		}
		for _, r := range p.value {
			if r < 0x20 || r == 0x7f {
				return "", errors.New("plain password holds a control character")
			}
		}
		return quote(p.value), nil
	case bcryptPassword:
		if !bcryptRe.MatchString(p.value) {
			return "", errors.New(`not a bcrypt hash (want "$2a$NN$" and 53 more characters)`)
		}
		return quote(p.value), nil
	case envPassword:
		if !envNameRe.MatchString(p.value) {
			return "", fmt.Errorf("environment variable name %q: use A-Z, 0-9 and '_', not starting with a digit", p.value)
		}
		return "$" + p.value, nil
	default:
		return "", errors.New("no password (use Plain, Bcrypt or Env)")
	}
}

// quote makes a double-quoted configuration string. The server's lexer
// understands \" and \\ inside such a string and does not expand variables
// there.
func quote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// User is a NATS user with a name and a password.
type User struct {
	// Name is the user name clients connect with: 1 to 128 characters
	// from A-Z, a-z, 0-9, '_', '-', '.' and '@'.
	Name string
	// Password is the user's password.
	Password Password
}

// TenantUser is the NATS user of one tenant's clients.
type TenantUser struct {
	// Name is the user name clients connect with (same rules as User).
	Name string
	// Password is the user's password.
	Password Password
	// Tenant is the tenant the user acts for, valid by
	// auth.ValidateTenant. Several users may share a tenant.
	Tenant string
}

// Options says what Config renders.
type Options struct {
	// Comment is written at the top of the file, each line prefixed
	// with "# ". Empty writes only the generator's own header line.
	Comment string

	// Listen is the client address, such as "0.0.0.0:4222"; empty leaves
	// the server's default.
	Listen string
	// HTTP is the monitoring address, such as "0.0.0.0:8222"; empty
	// leaves monitoring off.
	HTTP string
	// JetStream turns JetStream on.
	JetStream bool
	// StoreDir is JetStream's directory; empty leaves the server's
	// default. Only used with JetStream.
	StoreDir string
	// Cluster, when set, makes the server a node of a cluster (see
	// Cluster); the users below are the same on every node.
	Cluster *Cluster
	// PingInterval is how often the server pings each client and each
	// route to another node, and PingMax how many pings may go unanswered
	// before it drops the connection. Zero leaves the server's defaults
	// (2 minutes, 2 pings): a node whose machine died without closing its
	// routes would then keep its peers sending it a share of queue-group
	// messages, lost, for minutes.
	PingInterval time.Duration
	PingMax      int

	// Prefix is the first part of every Harvest subject (one or more
	// dot-separated tokens of A-Z, a-z, 0-9, '_', '-');
	// dispatch.DefaultPrefix when empty.
	Prefix string

	// Services are the users of gateways and workers. They may publish
	// and subscribe anywhere. At least one is required.
	Services []User
	// Handlers are the users of the services that run workflow code for
	// the stock worker: they may subscribe to <prefix>.handle.> and
	// answer the requests they receive, nothing else.
	Handlers []User
	// HandlerReplyWindow is how long a handler may take to answer a
	// request; zero leaves the server's default (two minutes), negative
	// means no limit.
	HandlerReplyWindow time.Duration
	// Tenants are the users of tenants' clients. Each may publish only on
	// its own tenant's start and batch-start subjects and subscribe only
	// to its own inbox prefix and its own run events.
	Tenants []TenantUser
}

// TenantPermissions returns the subjects a tenant user may publish on and
// subscribe to, with the given subject prefix (dispatch.DefaultPrefix when
// empty).
func TenantPermissions(prefix, tenant string) (publish, subscribe []string) {
	if prefix == "" {
		prefix = dispatch.DefaultPrefix
	}
	subj := dispatch.Subjects{Prefix: prefix}
	publish = []string{subj.Start(tenant), subj.StartBatch(tenant)}
	subscribe = []string{InboxPrefix(tenant) + ".>", subj.RunsOf(tenant)}
	return publish, subscribe
}

// Config renders a nats-server configuration file from opts: the listen,
// monitoring and JetStream lines it asks for, the cluster block of a node
// of a cluster, and an authorization block with one entry per user. Users
// get, in order: services (no limits), handlers, tenants. The output
// depends only on opts, so a checked-in file can be compared with it.
func Config(opts Options) (string, error) {
	prefix := opts.Prefix
	if prefix == "" {
		prefix = dispatch.DefaultPrefix
	}
	if !prefixRe.MatchString(prefix) {
		return "", fmt.Errorf("natsauth: prefix %q: use dot-separated tokens of A-Z, a-z, 0-9, '_' and '-'", prefix)
	}
	if len(opts.Services) == 0 {
		return "", errors.New("natsauth: at least one service user is needed (gateways and workers connect with it)")
	}
	seen := map[string]string{}
	checkUser := func(role string, i int, name string, pw Password) (string, error) {
		where := fmt.Sprintf("%s[%d] (%q)", role, i, name)
		if !userRe.MatchString(name) {
			return "", fmt.Errorf("natsauth: %s: user name must be 1 to 128 characters from A-Z, a-z, 0-9, '_', '-', '.' and '@'", where)
		}
		if other, dup := seen[name]; dup {
			return "", fmt.Errorf("natsauth: %s: user name already used by %s", where, other)
		}
		seen[name] = where
		out, err := pw.render()
		if err != nil {
			return "", fmt.Errorf("natsauth: %s: password: %w", where, err)
		}
		return out, nil
	}

	var b strings.Builder
	b.WriteString("# nats-server configuration for Harvest, made by internal/natsauth.Config.\n")
	if opts.Comment != "" {
		b.WriteString("#\n")
		for line := range strings.SplitSeq(strings.TrimRight(opts.Comment, "\n"), "\n") {
			if line == "" {
				b.WriteString("#\n")
				continue
			}
			b.WriteString("# " + line + "\n")
		}
	}
	b.WriteString("\n")
	if opts.Listen != "" {
		fmt.Fprintf(&b, "listen: %s\n", quote(opts.Listen))
	}
	if opts.HTTP != "" {
		fmt.Fprintf(&b, "http: %s\n", quote(opts.HTTP))
	}
	if opts.JetStream {
		if opts.StoreDir != "" {
			fmt.Fprintf(&b, "jetstream {\n  store_dir: %s\n}\n", quote(opts.StoreDir))
		} else {
			b.WriteString("jetstream: enabled\n")
		}
	}
	if opts.PingInterval < 0 || (opts.PingInterval > 0 && opts.PingInterval%time.Second != 0) {
		return "", fmt.Errorf("natsauth: ping interval %s: want whole seconds", opts.PingInterval)
	}
	if opts.PingMax < 0 {
		return "", fmt.Errorf("natsauth: ping max %d: want 0 (the server's default) or more", opts.PingMax)
	}
	if opts.PingInterval > 0 {
		fmt.Fprintf(&b, "ping_interval: %s\n", quote(strconv.FormatInt(int64(opts.PingInterval/time.Second), 10)+"s"))
	}
	if opts.PingMax > 0 {
		fmt.Fprintf(&b, "ping_max: %d\n", opts.PingMax)
	}
	if opts.Listen != "" || opts.HTTP != "" || opts.JetStream || opts.PingInterval > 0 || opts.PingMax > 0 {
		b.WriteString("\n")
	}
	if opts.Cluster != nil {
		if err := opts.Cluster.render(&b); err != nil {
			return "", err
		}
	}

	b.WriteString("authorization {\n  users = [\n")
	for i, u := range opts.Services {
		pw, err := checkUser("service", i, u.Name, u.Password)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "    # Service user (gateways, workers): no restrictions.\n")
		fmt.Fprintf(&b, "    {user: %s, password: %s}\n", quote(u.Name), pw)
	}
	for i, u := range opts.Handlers {
		pw, err := checkUser("handler", i, u.Name, u.Password)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "    # Handler service: takes %s.handle.> requests and answers them.\n", prefix)
		fmt.Fprintf(&b, "    {\n      user: %s, password: %s\n      permissions: {\n", quote(u.Name), pw)
		fmt.Fprintf(&b, "        subscribe: {allow: [%s]}\n", quote(prefix+".handle.>"))
		b.WriteString("        allow_responses: " + replyWindow(opts.HandlerReplyWindow) + "\n")
		b.WriteString("      }\n    }\n")
	}
	for i, u := range opts.Tenants {
		pw, err := checkUser("tenant", i, u.Name, u.Password)
		if err != nil {
			return "", err
		}
		if err := auth.ValidateTenant(u.Tenant); err != nil {
			return "", fmt.Errorf("natsauth: tenant[%d] (%q): %w", i, u.Name, err)
		}
		pub, sub := TenantPermissions(prefix, u.Tenant)
		fmt.Fprintf(&b, "    # Tenant %s: starts its own runs, hears its own replies and run events.\n", u.Tenant)
		fmt.Fprintf(&b, "    {\n      user: %s, password: %s\n      permissions: {\n", quote(u.Name), pw)
		fmt.Fprintf(&b, "        publish: {allow: [%s]}\n", quoteList(pub))
		fmt.Fprintf(&b, "        subscribe: {allow: [%s]}\n", quoteList(sub))
		b.WriteString("      }\n    }\n")
	}
	b.WriteString("  ]\n}\n")
	return b.String(), nil
}

func replyWindow(d time.Duration) string {
	switch {
	case d == 0:
		return "true"
	case d < 0:
		return `{max: 1, expires: "-1s"}`
	default:
		return `{max: 1, expires: ` + strconv.Quote(d.String()) + `}`
	}
}

func quoteList(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = quote(s)
	}
	return strings.Join(q, ", ")
}
