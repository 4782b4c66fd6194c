package gateway

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/harvest-run/harvest/internal/config"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// Config is the gateway's environment (prefix HARVEST_). Load it with
// config.Load and check it with Validate.
type Config struct {
	config.Common
	// Settings are the admission knobs: HARVEST_MAX_RUNS (the read-only
	// system limit), HARVEST_ADMISSION_REFRESH, HARVEST_ADMISSION_RELOAD.
	tenantcap.Settings

	Addr             string        `envconfig:"GATEWAY_ADDR" default:":8080" desc:"HTTP listen address"`
	TokensFile       string        `envconfig:"GATEWAY_TOKENS_FILE" desc:"path of the bearer tokens file (JSON); empty refuses every HTTP call that needs a token"`
	TokensPoll       time.Duration `envconfig:"GATEWAY_TOKENS_POLL" default:"2s" desc:"how often the tokens file is checked for changes (SIGHUP reloads at once)"`
	MaxBodyBytes     int64         `envconfig:"GATEWAY_MAX_BODY_BYTES" default:"1048576" desc:"largest request body (HTTP) or message (NATS) accepted; larger ones get 413"`
	KeyBinding       bool          `envconfig:"GATEWAY_KEY_BINDING" default:"true" desc:"bind fairness and quota keys to the tenant: no key becomes <tenant>, key k becomes <tenant>/k (false lets any tenant name any key and take its weight and its quota: logged at start)"`
	SubjectPrefix    string        `envconfig:"GATEWAY_SUBJECT_PREFIX" default:"harvest" desc:"first token(s) of every NATS subject"`
	QueueGroup       string        `envconfig:"GATEWAY_QUEUE_GROUP" default:"harvest-gateways" desc:"NATS queue group the gateways share for start requests"`
	NATSInflight     int           `envconfig:"GATEWAY_NATS_INFLIGHT" default:"1024" desc:"NATS start requests handled at once; more wait in the client library"`
	MaxWait          time.Duration `envconfig:"GATEWAY_MAX_WAIT" default:"60s" desc:"longest ?wait= of GET /v1/runs/{id}"`
	MaxScheduleAhead time.Duration `envconfig:"GATEWAY_MAX_SCHEDULE_AHEAD" default:"720h" desc:"how far ahead a start's run_at or delay may lie: a run not due yet holds an admission slot all the while"`

	ReadHeaderTimeout time.Duration `envconfig:"GATEWAY_READ_HEADER_TIMEOUT" default:"5s" desc:"time a client has to send a request's headers"`
	ReadTimeout       time.Duration `envconfig:"GATEWAY_READ_TIMEOUT" default:"30s" desc:"time a client has to send a whole request, body included"`
	WriteTimeout      time.Duration `envconfig:"GATEWAY_WRITE_TIMEOUT" default:"30s" desc:"time an answer may take from the end of its request (a ?wait= long poll gets its wait on top)"`
	IdleTimeout       time.Duration `envconfig:"GATEWAY_IDLE_TIMEOUT" default:"60s" desc:"how long an idle keep-alive connection is kept open"`
	WaitPoll          time.Duration `envconfig:"GATEWAY_WAIT_POLL" default:"500ms" desc:"how often a ?wait= request rereads the run while the gateway has no NATS connection (no run event can wake it)"`
	DirectoryRefresh  time.Duration `envconfig:"GATEWAY_DIRECTORY_REFRESH" default:"5s" desc:"how often the gateway rereads the tenants whose home changed on shard 0, besides the NATS change events: the longest a lost event keeps it on an old home"`
	PoolSize          int32         `envconfig:"GATEWAY_POOL_SIZE" default:"8" desc:"Postgres connections per shard"`
	ConnectTimeout    time.Duration `envconfig:"GATEWAY_CONNECT_TIMEOUT" default:"3s" desc:"how long to try reaching a shard before answering 503"`
	GroupMax          int           `envconfig:"GATEWAY_GROUP_MAX" default:"48" desc:"most starts committed in one transaction (group commit)"`
	GroupFlushers     int           `envconfig:"GATEWAY_GROUP_FLUSHERS" default:"2" desc:"start transactions in flight per shard; a tenant is in one at a time, and a second goes only when a quarter of HARVEST_GATEWAY_GROUP_MAX starts wait for it"`
	GroupLinger       time.Duration `envconfig:"GATEWAY_GROUP_LINGER" default:"0s" desc:"extra wait for more starts before a group commits (0: take what queued up during the previous commit)"`
	AdminSession      time.Duration `envconfig:"GATEWAY_ADMIN_SESSION" default:"30m" desc:"lifetime of a sign-in to the /admin page (sessions live in the memory of the gateway that made them)"`
	TraceURL          string        `envconfig:"GATEWAY_TRACE_URL" desc:"link from a run's page in the console to its trace: an http(s) URL in which {trace_id} stands for the trace id, such as http://localhost:16686/trace/{trace_id} for Jaeger (empty: the id is shown without a link)"`
	CookieSecure      string        `envconfig:"GATEWAY_COOKIE_SECURE" default:"auto" desc:"Secure flag of the /admin cookies: auto (over TLS, or when a proxy sends X-Forwarded-Proto: https) or always (a gateway behind a TLS proxy that does not say so)"`

	// Console sign-ins: each token holds a few sessions and signs in at a
	// bounded pace, so that no token crowds the others out of the
	// session table (docs/console.md).
	AdminSessionsPerToken int `envconfig:"GATEWAY_ADMIN_SESSIONS_PER_TOKEN" default:"5" desc:"console sessions one token holds at once on a gateway; signing in again past it ends that token's own oldest session"`
	AdminSignInsPerMinute int `envconfig:"GATEWAY_ADMIN_SIGNINS_PER_MINUTE" default:"10" desc:"console sign-ins one token may make per minute on a gateway (as many at once); more are refused with 429 and Retry-After"`

	// Long polls (?wait=): a waiter is woken by its run's NATS event and
	// rereads the run only now and then besides, and each gateway holds a
	// bounded number of them, per tenant and in all.
	WaitFallback        time.Duration `envconfig:"GATEWAY_WAIT_FALLBACK" default:"5s" desc:"how often a ?wait= request rereads the run while NATS is connected, in case its run event was lost (each wait picks a little less at random, so waits started together do not reread together)"`
	MaxWaiters          int           `envconfig:"GATEWAY_MAX_WAITERS" default:"10000" desc:"most ?wait= requests the gateway holds at once; more get 429 over_limit with Retry-After (or their run at once when it is already final)"`
	MaxWaitersPerTenant int           `envconfig:"GATEWAY_MAX_WAITERS_PER_TENANT" default:"100" desc:"most ?wait= requests the gateway holds at once for one tenant; more get 429 over_limit with Retry-After (or their run at once when it is already final)"`

	// Run listings read a tenant's runs until a page is full, on the pool
	// the starts commit through: each tenant has a bound of its own.
	MaxListsPerTenant int `envconfig:"GATEWAY_MAX_LISTS_PER_TENANT" default:"2" desc:"most listings the gateway reads at once for one tenant: run listings (GET /v1/runs, the tenant's console runs page) and per-key views (GET /v1/queues/{queue}/keys) together; more get 429 over_limit with Retry-After. Keep it below HARVEST_GATEWAY_POOL_SIZE, so that one tenant's listings cannot hold every connection the shard's starts need"`

	// Shedding (shed.go, docs/operations.md "Overload"): each shard has a
	// budget of starts in flight on the gateway, HTTP and NATS together,
	// shared fairly between tenants; the excess is refused at once with
	// Retry-After rather than queued until its callers time out.
	StartsInflight   int           `envconfig:"GATEWAY_STARTS_INFLIGHT" default:"512" desc:"most starts the gateway has in flight to one shard, HTTP and NATS together (a batch counts its items); the gateway lowers this budget by itself while starts take longer than HARVEST_GATEWAY_START_QUEUE_TARGET; starts past it are answered 503 unavailable with Retry-After"`
	TenantStartShare int           `envconfig:"GATEWAY_TENANT_START_SHARE" default:"50" desc:"percentage of a shard's budget of starts in flight that one tenant may hold, its waiting starts included; past it the tenant's starts are answered 429 over_limit with Retry-After (100: no share, logged at start)"`
	StartQueueWait   time.Duration `envconfig:"GATEWAY_START_QUEUE_WAIT" default:"50ms" desc:"how long a start waits for room when its shard's budget is full before it is answered 503 (0: at once); when room comes, the waiting tenant with the fewest starts in flight goes first"`
	StartQueueTarget time.Duration `envconfig:"GATEWAY_START_QUEUE_TARGET" default:"500ms" desc:"how much longer than unloaded a start may take before the gateway lowers the shard's budget to what the shard commits in that time"`
	ShedRetryAfter   time.Duration `envconfig:"GATEWAY_SHED_RETRY_AFTER" default:"1s" desc:"wait asked of a start refused by shedding or answered 503 because its shard did not answer (Retry-After in whole seconds, retry_after_ms in the body)"`
}

// Values of HARVEST_GATEWAY_COOKIE_SECURE.
const (
	CookieSecureAuto   = "auto"
	CookieSecureAlways = "always"
)

var prefixRe = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)

// Validate checks the settings; each error names its variable.
func (c Config) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return err
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("HARVEST_GATEWAY_ADDR: %q is not host:port: %v", c.Addr, err)
	}
	var errs []error
	if err := c.Settings.Validate(); err != nil {
		errs = append(errs, err)
	}
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.TokensPoll > 0, "HARVEST_GATEWAY_TOKENS_POLL: must be positive, got %s", c.TokensPoll)
	check(c.MaxBodyBytes >= 1024, "HARVEST_GATEWAY_MAX_BODY_BYTES: must be at least 1024, got %d", c.MaxBodyBytes)
	check(prefixRe.MatchString(c.SubjectPrefix), "HARVEST_GATEWAY_SUBJECT_PREFIX: %q: use dot-separated tokens of A-Z, a-z, 0-9, '_' and '-'", c.SubjectPrefix)
	check(c.QueueGroup != "", "HARVEST_GATEWAY_QUEUE_GROUP: must not be empty")
	check(c.NATSInflight >= 1, "HARVEST_GATEWAY_NATS_INFLIGHT: must be at least 1, got %d", c.NATSInflight)
	check(c.MaxWait > 0, "HARVEST_GATEWAY_MAX_WAIT: must be positive, got %s", c.MaxWait)
	check(c.MaxScheduleAhead > 0, "HARVEST_GATEWAY_MAX_SCHEDULE_AHEAD: must be positive, got %s", c.MaxScheduleAhead)
	check(c.ReadHeaderTimeout > 0, "HARVEST_GATEWAY_READ_HEADER_TIMEOUT: must be positive, got %s", c.ReadHeaderTimeout)
	check(c.ReadTimeout >= c.ReadHeaderTimeout, "HARVEST_GATEWAY_READ_TIMEOUT: must be at least HARVEST_GATEWAY_READ_HEADER_TIMEOUT (%s), got %s", c.ReadHeaderTimeout, c.ReadTimeout)
	check(c.WriteTimeout > 0, "HARVEST_GATEWAY_WRITE_TIMEOUT: must be positive, got %s", c.WriteTimeout)
	check(c.IdleTimeout > 0, "HARVEST_GATEWAY_IDLE_TIMEOUT: must be positive, got %s", c.IdleTimeout)
	check(c.WaitPoll > 0, "HARVEST_GATEWAY_WAIT_POLL: must be positive, got %s", c.WaitPoll)
	check(c.WaitFallback >= c.WaitPoll, "HARVEST_GATEWAY_WAIT_FALLBACK: must be at least HARVEST_GATEWAY_WAIT_POLL (%s), got %s", c.WaitPoll, c.WaitFallback)
	check(c.MaxWaiters >= 1, "HARVEST_GATEWAY_MAX_WAITERS: must be at least 1, got %d", c.MaxWaiters)
	check(c.MaxListsPerTenant >= 1, "HARVEST_GATEWAY_MAX_LISTS_PER_TENANT: must be at least 1, got %d", c.MaxListsPerTenant)
	check(c.MaxWaitersPerTenant >= 1 && c.MaxWaitersPerTenant <= c.MaxWaiters, "HARVEST_GATEWAY_MAX_WAITERS_PER_TENANT: must be from 1 to HARVEST_GATEWAY_MAX_WAITERS (%d), got %d", c.MaxWaiters, c.MaxWaitersPerTenant)
	check(c.DirectoryRefresh >= 100*time.Millisecond && c.DirectoryRefresh <= 10*time.Minute, "HARVEST_GATEWAY_DIRECTORY_REFRESH: must be from 100ms to 10m, got %s", c.DirectoryRefresh)
	check(c.PoolSize >= 1, "HARVEST_GATEWAY_POOL_SIZE: must be at least 1, got %d", c.PoolSize)
	check(c.ConnectTimeout > 0, "HARVEST_GATEWAY_CONNECT_TIMEOUT: must be positive, got %s", c.ConnectTimeout)
	check(c.GroupMax >= 1 && c.GroupMax <= 60, "HARVEST_GATEWAY_GROUP_MAX: must be from 1 to 60 (PostgreSQL caches 64 subtransactions), got %d", c.GroupMax)
	check(c.GroupFlushers >= 1, "HARVEST_GATEWAY_GROUP_FLUSHERS: must be at least 1, got %d", c.GroupFlushers)
	check(c.AdminSession >= time.Minute && c.AdminSession <= 24*time.Hour, "HARVEST_GATEWAY_ADMIN_SESSION: must be from 1m to 24h, got %s", c.AdminSession)
	check(c.AdminSessionsPerToken >= 1 && c.AdminSessionsPerToken <= 100, "HARVEST_GATEWAY_ADMIN_SESSIONS_PER_TOKEN: must be from 1 to 100, got %d", c.AdminSessionsPerToken)
	check(c.AdminSignInsPerMinute >= 1 && c.AdminSignInsPerMinute <= 600, "HARVEST_GATEWAY_ADMIN_SIGNINS_PER_MINUTE: must be from 1 to 600, got %d", c.AdminSignInsPerMinute)
	check(c.CookieSecure == CookieSecureAuto || c.CookieSecure == CookieSecureAlways, "HARVEST_GATEWAY_COOKIE_SECURE: must be %s or %s, got %q", CookieSecureAuto, CookieSecureAlways, c.CookieSecure)
	check(c.StartsInflight >= 1 && c.StartsInflight <= 1_000_000, "HARVEST_GATEWAY_STARTS_INFLIGHT: must be from 1 to 1000000, got %d", c.StartsInflight)
	check(c.TenantStartShare >= 1 && c.TenantStartShare <= 100, "HARVEST_GATEWAY_TENANT_START_SHARE: must be a percentage from 1 to 100, got %d", c.TenantStartShare)
	check(c.StartQueueWait >= 0 && c.StartQueueWait <= time.Second, "HARVEST_GATEWAY_START_QUEUE_WAIT: must be from 0 to 1s (a refused start's answer waits this long), got %s", c.StartQueueWait)
	check(c.StartQueueTarget >= 10*time.Millisecond && c.StartQueueTarget <= time.Minute, "HARVEST_GATEWAY_START_QUEUE_TARGET: must be from 10ms to 1m, got %s", c.StartQueueTarget)
	check(c.ShedRetryAfter >= 100*time.Millisecond && c.ShedRetryAfter <= 10*time.Minute, "HARVEST_GATEWAY_SHED_RETRY_AFTER: must be from 100ms to 10m, got %s", c.ShedRetryAfter)
	check(c.GroupLinger >= 0 && c.GroupLinger <= 50*time.Millisecond, "HARVEST_GATEWAY_GROUP_LINGER: must be from 0 to 50ms, got %s", c.GroupLinger)
	if c.TraceURL != "" {
		check(validTraceURL(c.TraceURL), "HARVEST_GATEWAY_TRACE_URL: %q: want an http or https URL holding {trace_id}", c.TraceURL)
	}
	return errors.Join(errs...)
}

// validTraceURL reports whether u is an absolute http(s) URL with the
// {trace_id} placeholder in it.
func validTraceURL(u string) bool {
	if !strings.Contains(u, traceIDPlaceholder) {
		return false
	}
	p, err := url.Parse(strings.ReplaceAll(u, traceIDPlaceholder, "0"))
	return err == nil && (p.Scheme == "http" || p.Scheme == "https") && p.Host != ""
}

// traceIDPlaceholder is what HARVEST_GATEWAY_TRACE_URL holds in place of
// the trace id.
const traceIDPlaceholder = "{trace_id}"

// TraceLink is the link to a trace from HARVEST_GATEWAY_TRACE_URL, or
// empty when none is set or the id is not a W3C trace id (32 hex digits).
func (c Config) TraceLink(traceID string) string {
	if c.TraceURL == "" || !traceIDRe.MatchString(traceID) {
		return ""
	}
	return strings.ReplaceAll(c.TraceURL, traceIDPlaceholder, traceID)
}

var traceIDRe = regexp.MustCompile(`^[0-9a-f]{32}$`)

// DefaultConfig returns the defaults with the given shards, for tests and
// embedding (harvest dev, benchmarks).
func DefaultConfig(shards []string, natsURL string) Config {
	return Config{
		Common:           config.Common{Shards: shards, NATSURL: natsURL},
		Settings:         tenantcap.DefaultSettings(),
		Addr:             ":8080",
		TokensPoll:       2 * time.Second,
		MaxBodyBytes:     1 << 20,
		SubjectPrefix:    "harvest",
		QueueGroup:       "harvest-gateways",
		NATSInflight:     1024,
		MaxWait:          60 * time.Second,
		MaxScheduleAhead: 30 * 24 * time.Hour,

		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,

		WaitPoll:         500 * time.Millisecond,
		DirectoryRefresh: 5 * time.Second,
		PoolSize:         8,
		ConnectTimeout:   3 * time.Second,
		KeyBinding:       true,
		GroupMax:         48,
		GroupFlushers:    2,
		AdminSession:     30 * time.Minute,
		CookieSecure:     CookieSecureAuto,

		AdminSessionsPerToken: 5,
		AdminSignInsPerMinute: 10,

		WaitFallback:        5 * time.Second,
		MaxWaiters:          10000,
		MaxWaitersPerTenant: 100,
		MaxListsPerTenant:   2,

		StartsInflight:   512,
		TenantStartShare: 50,
		StartQueueWait:   50 * time.Millisecond,
		StartQueueTarget: 500 * time.Millisecond,
		ShedRetryAfter:   time.Second,
	}
}
