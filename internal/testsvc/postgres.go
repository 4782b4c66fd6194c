package testsvc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/internal/dberr"
	"github.com/harvest-run/harvest/internal/pgcluster"
	"github.com/harvest-run/harvest/internal/schema"
)

// EnvDatabaseURL names the environment variable holding the admin URL of
// the PostgreSQL server tests use.
const EnvDatabaseURL = "HARVEST_TEST_DATABASE_URL"

// DefaultDatabaseURL is the server tried when EnvDatabaseURL is unset.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// probeTimeout bounds the one connection attempt that decides whether the
// configured server is there.
const probeTimeout = 2 * time.Second

// opTimeout bounds the administrative statements (create, migrate, drop).
const opTimeout = 2 * time.Minute

// mainRunning is set by Main; the database helpers insist on it so that a
// self-started server is always stopped.
var mainRunning atomic.Bool

// server is the per-process choice of PostgreSQL server.
var server struct {
	once sync.Once
	url  string
	note string // how the server was chosen, logged to the first caller
	err  error

	mu      sync.Mutex
	cluster *pgcluster.Cluster // non-nil when this process started one
	stopSig func()             // stops the interrupt handler
}

// Main runs the tests of a package and exits with their result, after
// stopping the PostgreSQL server it started for them, if any. Use it as
// the package's TestMain:
//
//	func TestMain(m *testing.M) { testsvc.Main(m) }
func Main(m *testing.M) {
	mainRunning.Store(true)
	code := m.Run()
	if err := dropTemplate(); err != nil {
		fmt.Fprintln(os.Stderr, "testsvc:", err)
	}
	if err := stopCluster(); err != nil {
		fmt.Fprintln(os.Stderr, "testsvc:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// stopCluster stops the self-started server, if there is one.
func stopCluster() error {
	server.mu.Lock()
	defer server.mu.Unlock()
	if server.stopSig != nil {
		server.stopSig()
		server.stopSig = nil
	}
	if server.cluster == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := server.cluster.Stop(ctx)
	server.cluster = nil
	return err
}

// ServerURL returns the admin URL of the PostgreSQL server tests use,
// choosing it on the first call of the process (see the package
// documentation). It fails the test when no server can be had, or when the
// configured one refuses the connection.
func ServerURL(t testing.TB) string {
	t.Helper()
	if !mainRunning.Load() {
		t.Fatal("testsvc: this package's tests use the database but do not run through testsvc.Main; " +
			"add: func TestMain(m *testing.M) { testsvc.Main(m) }")
	}
	first := false
	server.once.Do(func() {
		first = true
		u := os.Getenv(EnvDatabaseURL)
		if u == "" {
			u = DefaultDatabaseURL
		}
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		var c *pgcluster.Cluster
		server.url, c, server.note, server.err = resolveServer(ctx, u, startCluster)
		if c != nil {
			server.mu.Lock()
			server.cluster = c
			server.stopSig = stopOnInterrupt()
			server.mu.Unlock()
			fmt.Fprintln(os.Stderr, server.note)
		}
	})
	if server.err != nil {
		t.Fatal(server.err)
	}
	if first && server.note != "" {
		t.Log(server.note)
	}
	return server.url
}

// stopOnInterrupt stops the self-started server when the test process is
// interrupted, so that Ctrl-C does not leave it running. It returns a
// function that removes the handler.
func stopOnInterrupt() func() {
	ch := make(chan os.Signal, 1)
	done := make(chan struct{})
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case sig := <-ch:
			signal.Stop(ch)
			server.mu.Lock()
			if c := server.cluster; c != nil {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_ = c.Stop(ctx)
				cancel()
			}
			fmt.Fprintf(os.Stderr, "testsvc: %v: stopped the throwaway PostgreSQL server\n", sig)
			os.Exit(2)
		case <-done:
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}

func startCluster(ctx context.Context) (*pgcluster.Cluster, error) {
	return pgcluster.Start(ctx, pgcluster.Options{})
}

// resolveServer probes adminURL and returns it when a server answers. When
// nothing answers there, it starts a server with start and returns that
// server's admin URL and the cluster, which the caller must stop. note
// says what happened.
func resolveServer(ctx context.Context, adminURL string,
	start func(context.Context) (*pgcluster.Cluster, error),
) (url string, c *pgcluster.Cluster, note string, err error) {
	perr := probe(ctx, adminURL)
	if perr == nil {
		return adminURL, nil, "", nil
	}
	if !dberr.Unreachable(perr) {
		return "", nil, "", fmt.Errorf("testsvc: the PostgreSQL server at %s (%s) refused the test connection: %w; "+
			"fix %s or the server", redact(adminURL), EnvDatabaseURL, perr, EnvDatabaseURL)
	}
	c, err = start(ctx)
	if err != nil {
		return "", nil, "", fmt.Errorf("testsvc: no PostgreSQL server answers at %s (%v), and starting a throwaway one failed: %w",
			redact(adminURL), perr, err)
	}
	note = fmt.Sprintf("testsvc: no PostgreSQL server answers at %s; started a throwaway server for this test process at %s (directory %s)",
		redact(adminURL), c.URL("postgres"), c.Dir())
	return c.URL("postgres"), c, note, nil
}

// probe makes one connection to adminURL with a short connect timeout.
func probe(ctx context.Context, adminURL string) error {
	cfg, err := pgx.ParseConfig(adminURL)
	if err != nil {
		return err
	}
	cfg.ConnectTimeout = probeTimeout
	ctx, cancel := context.WithTimeout(ctx, 2*probeTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.Ping(ctx)
}

var passwordKV = regexp.MustCompile(`(?i)(password\s*=\s*)('[^']*'|\S+)`)

// redact hides a password in a URL or keyword/value connection string.
func redact(conn string) string {
	if u, err := url.Parse(conn); err == nil && u.Scheme != "" {
		return u.Redacted()
	}
	return passwordKV.ReplaceAllString(conn, "${1}xxxxx")
}

// RandomName returns prefix followed by 16 random hex digits, usable as a
// database, subject or stream name that no other test picks.
func RandomName(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// NewDB creates a migrated database for this test and returns a pool
// connected to it. The pool is closed and the database dropped when the
// test ends.
func NewDB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dbURL := NewDBURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatalf("testsvc: connect to test database: %v", err)
	}
	// Runs before the drop registered by NewDBURL.
	t.Cleanup(func() { closePool(t, pool, poolCloseWait) })
	return pool
}

// poolCloseWait is how long a test's pool may take to close at cleanup.
const poolCloseWait = 15 * time.Second

// closePool closes a test's pool. Close waits for every connection to be
// given back, so a transaction the test left open (a check that failed
// between Begin and Rollback, say) would hold the cleanup, and the whole
// package with it, until the test binary's timeout. Past wait the test
// fails, saying so, and the database is dropped anyway (the drop ends the
// connections still open).
func closePool(t testing.TB, pool *pgxpool.Pool, wait time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		pool.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(wait):
		t.Errorf("testsvc: the test's pool still had %d connections in use %s after the test ended: a transaction or rows left open?",
			pool.Stat().AcquiredConns(), wait)
	}
}

// NewDBURL creates a migrated database for this test and returns its URL.
// The database is dropped when the test ends, even if connections to it
// are still open.
func NewDBURL(t testing.TB) string {
	t.Helper()
	return newDB(t, ServerURL(t), true)
}

// NewEmptyDBURL is NewDBURL without the migrations, for tests of the
// migrations themselves.
func NewEmptyDBURL(t testing.TB) string {
	t.Helper()
	return newDB(t, ServerURL(t), false)
}

// NewDBCollatedURL creates a migrated database whose default collation is
// the ICU locale icuLocale ("en-US") rather than the server's, and returns
// its URL; it is dropped when the test ends. Tests of lock order use it:
// under such a collation "a_b" sorts before "a-c" and "a" before "B",
// unlike bytes. The test is skipped when the server was built without ICU.
func NewDBCollatedURL(t testing.TB, icuLocale string) string {
	t.Helper()
	adminURL := ServerURL(t)
	name := RandomName(fmt.Sprintf("%s%d_", icuDBPrefix, os.Getpid()))
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	err := adminExec(ctx, adminURL, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+
		" TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE "+quoteLiteral(icuLocale))
	if dberr.Code(err) == dberr.CodeFeatureNotSupported { // no ICU
		t.Skipf("testsvc: the server has no ICU collations: %v", err)
	}
	if err != nil {
		t.Fatalf("testsvc: create database %s with ICU locale %s: %v", name, icuLocale, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := dropDB(ctx, adminURL, name); err != nil {
			t.Errorf("testsvc: %v", err)
		}
	})
	dbURL := withDatabase(adminURL, name)
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("testsvc: connect to %s: %v", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := schema.Migrate(ctx, conn); err != nil {
		t.Fatalf("testsvc: migrate %s: %v", name, err)
	}
	return dbURL
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// newDB creates a database on the server at adminURL, migrated (a copy of
// the process's migrated template) or empty, registers its drop with
// t.Cleanup and returns its URL.
func newDB(t testing.TB, adminURL string, migrate bool) string {
	t.Helper()
	name := RandomName(fmt.Sprintf("%s%d_", testDBPrefix, os.Getpid()))
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()

	// template0 takes no connections, so concurrent creates cannot collide
	// on it, and nobody can have left anything in it; the migrated
	// template takes none either once it is made.
	from := "template0"
	if migrate {
		var err error
		if from, err = migratedTemplate(ctx, adminURL); err != nil {
			t.Fatalf("testsvc: %v", err)
		}
	}
	if err := adminExec(ctx, adminURL, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE "+pgx.Identifier{from}.Sanitize()); err != nil {
		t.Fatalf("testsvc: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := dropDB(ctx, adminURL, name); err != nil {
			t.Errorf("testsvc: %v", err)
		}
	})

	return withDatabase(adminURL, name)
}

// templates are the process's migrated databases, one per server by its
// admin URL, copied for every test database instead of migrating each one
// from scratch.
var templates struct {
	mu    sync.Mutex
	byURL map[string]string
}

// templatePrefix starts the name of every template, testDBPrefix and
// icuDBPrefix that of every test database; the process id follows, so a
// database left by a killed process (a fuzzing worker the engine stopped,
// a test binary killed at its timeout: neither runs its cleanups) can be
// told from a live one's.
const (
	templatePrefix = "harvest_tmpl_"
	testDBPrefix   = "harvest_test_"
	icuDBPrefix    = "harvest_test_icu_"
)

// migratedTemplate returns the process's migrated template database,
// making it on the first call: created from template0, migrated, then
// closed to connections, so that copies of it can be made at once.
func migratedTemplate(ctx context.Context, adminURL string) (string, error) {
	templates.mu.Lock()
	defer templates.mu.Unlock()
	if name, ok := templates.byURL[adminURL]; ok {
		return name, nil
	}
	dropStale(ctx, adminURL)
	name := RandomName(fmt.Sprintf("%s%d_", templatePrefix, os.Getpid()))
	quoted := pgx.Identifier{name}.Sanitize()
	if err := adminExec(ctx, adminURL, "CREATE DATABASE "+quoted+" TEMPLATE template0"); err != nil {
		return "", fmt.Errorf("create template %s: %w", name, err)
	}
	conn, err := pgx.Connect(ctx, withDatabase(adminURL, name))
	if err == nil {
		_, err = schema.Migrate(ctx, conn)
		_ = conn.Close(context.WithoutCancel(ctx))
	}
	if err == nil {
		err = adminExec(ctx, adminURL, "ALTER DATABASE "+quoted+" WITH ALLOW_CONNECTIONS false IS_TEMPLATE true")
	}
	if err != nil {
		_ = dropDatabase(ctx, adminURL, name, true)
		return "", fmt.Errorf("migrate template %s: %w", name, err)
	}
	if templates.byURL == nil {
		templates.byURL = map[string]string{}
	}
	templates.byURL[adminURL] = name
	return name, nil
}

// dropTemplate drops the process's templates on the servers still up
// (one this process started is stopped with them in it).
func dropTemplate() error {
	templates.mu.Lock()
	defer templates.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	var errs []error
	for url, name := range templates.byURL {
		if err := dropDatabase(ctx, url, name, true); err != nil && !dberr.Unreachable(err) {
			errs = append(errs, err)
		}
	}
	templates.byURL = nil
	return errors.Join(errs...)
}

// dropStale drops the templates and test databases of processes that are
// gone (killed before their cleanups or their Main could drop them), once
// per process and server, when the process makes its template. Names of
// another form (an older scheme without the process id) are left alone.
// Best effort: a failure leaves them for the next process.
func dropStale(ctx context.Context, adminURL string) {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return
	}
	rows, err := conn.Query(ctx, `SELECT datname FROM pg_database WHERE datname LIKE ANY ($1)`,
		[]string{templatePrefix + "%", testDBPrefix + "%"})
	var names []string
	if err == nil {
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	_ = conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return
	}
	for _, n := range names {
		if p, ok := creator(n); ok && p != os.Getpid() {
			if err := syscall.Kill(p, 0); errors.Is(err, syscall.ESRCH) {
				_ = dropDatabase(ctx, adminURL, n, true)
			}
		}
	}
}

// creator is the process id in a template's or test database's name.
func creator(name string) (int, bool) {
	for _, prefix := range []string{icuDBPrefix, templatePrefix, testDBPrefix} {
		if rest, ok := strings.CutPrefix(name, prefix); ok {
			pid, _, ok := strings.Cut(rest, "_")
			p, err := strconv.Atoi(pid)
			return p, ok && err == nil && p > 0
		}
	}
	return 0, false
}

func dropDB(ctx context.Context, adminURL, name string) error {
	return dropDatabase(ctx, adminURL, name, false)
}

// dropDatabase drops a database, even one that is marked a template
// (which must be unmarked first) or has connections open.
func dropDatabase(ctx context.Context, adminURL, name string, isTemplate bool) error {
	quoted := pgx.Identifier{name}.Sanitize()
	if isTemplate {
		_ = adminExec(ctx, adminURL, "ALTER DATABASE "+quoted+" WITH IS_TEMPLATE false")
	}
	if err := adminExec(ctx, adminURL, "DROP DATABASE IF EXISTS "+quoted+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

func adminExec(ctx context.Context, adminURL, sql string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}

// withDatabase returns adminURL pointed at database db. It accepts both URL
// and keyword/value connection strings.
func withDatabase(adminURL, db string) string {
	if u, err := url.Parse(adminURL); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + db
		u.RawPath = ""
		return u.String()
	}
	// In a keyword/value string the last occurrence of a keyword wins.
	return strings.TrimSpace(adminURL) + " dbname=" + db
}
