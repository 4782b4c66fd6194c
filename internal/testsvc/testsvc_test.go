package testsvc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/pgcluster"
	"github.com/harvest-run/harvest/internal/schema"
)

func TestMain(m *testing.M) { Main(m) }

// databaseExists asks the admin connection whether database name exists.
func databaseExists(t *testing.T, adminURL, name string) bool {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), adminURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var exists bool
	require.NoError(t, conn.QueryRow(t.Context(),
		`SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists))
	return exists
}

func schemaVersion(t *testing.T, dbURL string) (db string, version int) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dbURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	require.NoError(t, conn.QueryRow(t.Context(),
		`SELECT current_database(), coalesce(max(version), 0) FROM schema_migrations`).Scan(&db, &version))
	return db, version
}

func TestNewDBIsMigratedAndDropped(t *testing.T) {
	t.Parallel()
	var name string
	t.Run("use", func(t *testing.T) {
		pool := NewDB(t)
		var version int
		require.NoError(t, pool.QueryRow(t.Context(),
			`SELECT current_database(), max(version) FROM schema_migrations`).Scan(&name, &version))
		require.True(t, strings.HasPrefix(name, "harvest_test_"), name)
		require.Equal(t, schema.Latest(), version)
		require.True(t, databaseExists(t, ServerURL(t), name))
	})
	require.NotEmpty(t, name)
	// The subtest's cleanups ran before t.Run returned.
	require.False(t, databaseExists(t, ServerURL(t), name), "database %s survived its test", name)
}

func TestNewDBsAreDistinct(t *testing.T) {
	t.Parallel()
	a, b := NewDB(t), NewDB(t)
	_, err := a.Exec(t.Context(), `CREATE TABLE only_in_a (x int)`)
	require.NoError(t, err)
	var found *string
	require.NoError(t, b.QueryRow(t.Context(), `SELECT to_regclass('only_in_a')::text`).Scan(&found))
	require.Nil(t, found)
}

func TestNewEmptyDBURLIsNotMigrated(t *testing.T) {
	t.Parallel()
	dbURL := NewEmptyDBURL(t)
	conn, err := pgx.Connect(t.Context(), dbURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var table *string
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT to_regclass('schema_migrations')::text`).Scan(&table))
	require.Nil(t, table, "an empty database has no migrations applied")
	version, err := schema.Migrate(t.Context(), conn)
	require.NoError(t, err)
	require.Equal(t, schema.Latest(), version)
}

// closedPortURL returns a URL on 127.0.0.1 where nothing listens.
func closedPortURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
}

func TestFallbackStartsCluster(t *testing.T) {
	t.Parallel()
	if _, err := pgcluster.FindBinaries(); err != nil {
		t.Skipf("cannot test the self-started server: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	started := 0
	start := func(ctx context.Context) (*pgcluster.Cluster, error) {
		started++
		return pgcluster.Start(ctx, pgcluster.Options{Logf: t.Logf})
	}
	adminURL, c, note, err := resolveServer(ctx, closedPortURL(t), start)
	require.NoError(t, err)
	require.NotNil(t, c)
	t.Cleanup(func() {
		require.NoError(t, c.Stop(context.Background()))
		require.NoDirExists(t, c.Dir())
	})
	require.Equal(t, 1, started)
	require.Equal(t, c.URL("postgres"), adminURL)
	require.Contains(t, note, "started a throwaway server")

	var name string
	t.Run("db", func(t *testing.T) {
		dbURL := newDB(t, adminURL, true)
		var version int
		name, version = schemaVersion(t, dbURL)
		require.Equal(t, schema.Latest(), version)
	})
	require.False(t, databaseExists(t, adminURL, name))
}

func TestReachableServerIsUsedAsIs(t *testing.T) {
	t.Parallel()
	adminURL := ServerURL(t)
	got, c, note, err := resolveServer(t.Context(), adminURL, func(context.Context) (*pgcluster.Cluster, error) {
		t.Error("started a server although one answers")
		return nil, errors.New("unexpected")
	})
	require.NoError(t, err)
	require.Nil(t, c)
	require.Empty(t, note)
	require.Equal(t, adminURL, got)
}

func TestRefusingServerFailsLoudly(t *testing.T) {
	t.Parallel()
	// The server answers, but the database does not exist: that is a
	// configuration mistake to report, not a reason to start another server.
	badURL := withDatabase(ServerURL(t), RandomName("harvest_no_such_db_"))
	_, c, _, err := resolveServer(t.Context(), badURL, func(context.Context) (*pgcluster.Cluster, error) {
		t.Error("fell back although the server answered")
		return nil, errors.New("unexpected")
	})
	require.Error(t, err)
	require.Nil(t, c)
	require.Contains(t, err.Error(), redact(badURL))
	require.Contains(t, err.Error(), EnvDatabaseURL)
}

func TestFallbackFailureMessage(t *testing.T) {
	t.Parallel()
	want := errors.New("no binaries here")
	_, c, _, err := resolveServer(t.Context(), closedPortURL(t), func(context.Context) (*pgcluster.Cluster, error) {
		return nil, want
	})
	require.ErrorIs(t, err, want)
	require.Nil(t, c)
	require.Contains(t, err.Error(), "no PostgreSQL server answers at")
}

func TestRedact(t *testing.T) {
	t.Parallel()
	require.Equal(t, "postgres://u:xxxxx@h/db", redact("postgres://u:secret@h/db"))
	require.Equal(t, "host=h password=xxxxx dbname=d", redact("host=h password=secret dbname=d"))
}

func TestWithDatabase(t *testing.T) {
	t.Parallel()
	require.Equal(t, "postgres://postgres@127.0.0.1:5432/x?sslmode=disable",
		withDatabase("postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "x"))
	require.Equal(t, "postgresql://h/x", withDatabase("postgresql://h", "x"))
	require.Equal(t, "host=h dbname=postgres dbname=x", withDatabase("host=h dbname=postgres", "x"))
}

func TestRandomName(t *testing.T) {
	t.Parallel()
	a, b := RandomName("p_"), RandomName("p_")
	require.NotEqual(t, a, b)
	require.Regexp(t, `^p_[0-9a-f]{16}$`, a)
}

func natsRoundTrip(t *testing.T, url string) {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	subject := RandomName("testsvc.echo.")
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) { _ = m.Respond(m.Data) })
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	reply, err := nc.Request(subject, []byte("ping"), 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "ping", string(reply.Data))
	js, err := nc.JetStream()
	require.NoError(t, err)
	_, err = js.AccountInfo()
	require.NoError(t, err, "JetStream is enabled")
}

func TestNATSURLEmbedded(t *testing.T) {
	t.Parallel()
	var url string
	t.Run("use", func(t *testing.T) {
		url = natsURL(t, "")
		natsRoundTrip(t, url)
	})
	_, err := nats.Connect(url, nats.Timeout(time.Second))
	require.Error(t, err, "the embedded server stops with its test")
}

func TestNATSURLExternal(t *testing.T) {
	t.Parallel()
	ext := os.Getenv(EnvNATSURL)
	if ext == "" {
		t.Skipf("%s is not set; the external-server path runs when it names a NATS server with JetStream", EnvNATSURL)
	}
	url := NATSURL(t)
	require.Equal(t, ext, url)
	natsRoundTrip(t, url)
}

// A template or test database whose process is gone (a fuzzing worker or
// a test binary killed before its cleanups ran) is dropped by the next
// process that makes its template; one of a live process, and a name of
// the older form without a process id, are kept.
func TestStaleDatabasesOfGoneProcessesAreDropped(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	adminURL := ServerURL(t)
	ended := exec.Command("true")
	require.NoError(t, ended.Run())
	gone := ended.Process.Pid
	stale := []string{
		RandomName(fmt.Sprintf("%s%d_", templatePrefix, gone)),
		RandomName(fmt.Sprintf("%s%d_", testDBPrefix, gone)),
		RandomName(fmt.Sprintf("%s%d_", icuDBPrefix, gone)),
	}
	kept := []string{
		RandomName(fmt.Sprintf("%s%d_", testDBPrefix, os.Getpid())),
		RandomName(testDBPrefix),
	}
	for _, n := range append(append([]string{}, stale...), kept...) {
		require.NoError(t, adminExec(ctx, adminURL, "CREATE DATABASE "+pgx.Identifier{n}.Sanitize()+" TEMPLATE template0"))
		t.Cleanup(func() { _ = dropDB(context.Background(), adminURL, n) })
	}
	dropStale(ctx, adminURL)
	for _, n := range stale {
		require.False(t, databaseExists(t, adminURL, n), "%s survived", n)
	}
	for _, n := range kept {
		require.True(t, databaseExists(t, adminURL, n), "%s was dropped", n)
	}
}

// BlocksRead counts what the transaction reads of the table, and only
// that: a scan of the whole table reads all its pages, a lookup of one row
// by its key a few.
func TestBlocksReadCountsTheTransactionsReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := NewDB(t)
	_, err := db.Exec(ctx, `CREATE TABLE blocks_probe (id int PRIMARY KEY, pad text);
		INSERT INTO blocks_probe SELECT g, repeat('x', 500) FROM generate_series(1, 2000) g;
		ANALYZE blocks_probe`)
	require.NoError(t, err)
	var pages int
	require.NoError(t, db.QueryRow(ctx, `SELECT relpages FROM pg_class WHERE relname = 'blocks_probe'`).Scan(&pages))
	require.Greater(t, pages, 50)

	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	read := BlocksRead(ctx, t, tx, "blocks_probe")
	require.Zero(t, read(), "nothing read yet")
	_, err = tx.Exec(ctx, `SELECT count(*) FROM blocks_probe WHERE pad <> ''`)
	require.NoError(t, err)
	scan := read()
	require.GreaterOrEqual(t, scan, pages, "a scan of the table reads every page")

	one := BlocksRead(ctx, t, tx, "blocks_probe")
	_, err = tx.Exec(ctx, `SELECT pad FROM blocks_probe WHERE id = 7`)
	require.NoError(t, err)
	require.Less(t, one(), 3, "a lookup by key reads its row's page")
	require.GreaterOrEqual(t, read(), scan, "each counter goes on from its own start")
}

// RequireFewBlocks lets a call that reads a few pages of runs and tasks
// pass, and fails one that scans runs, naming the table it read.
func TestRequireFewBlocksFailsAScan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := NewDB(t)
	runPages, taskPages := AddHistory(ctx, t, db, "q", 3000)
	require.Greater(t, runPages, 10)
	require.Greater(t, taskPages, 10)
	_, err := db.Exec(ctx, `ANALYZE runs, tasks`)
	require.NoError(t, err)
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // read only

	lookups := &recordingTB{TB: t}
	RequireFewBlocks(ctx, lookups, tx, 10, func() {
		_, err := tx.Exec(ctx, `SELECT r.name, t.queue FROM runs r, tasks t WHERE r.pk = 7 AND t.id = 7`)
		require.NoError(t, err)
	})
	require.Empty(t, lookups.errors)

	scan := &recordingTB{TB: t}
	RequireFewBlocks(ctx, scan, tx, 10, func() {
		_, err := tx.Exec(ctx, `SELECT count(*) FROM runs WHERE name <> ''`)
		require.NoError(t, err)
	})
	require.Len(t, scan.errors, 1)
	require.Contains(t, scan.errors[0], "blocks of runs")
}

// A test that ends with a transaction open fails with a message at its
// cleanup instead of holding the package until the binary's timeout.
func TestOpenTransactionAtTheEndFailsTheTest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, NewDBURL(t))
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	rec := &recordingTB{TB: t}
	closePool(rec, pool, 100*time.Millisecond)
	require.Len(t, rec.errors, 1)
	require.Contains(t, rec.errors[0], "1 connections in use")
	// Giving the connection back lets the close end.
	require.NoError(t, tx.Rollback(ctx))
}

// recordingTB keeps the errors reported to it instead of failing the test.
type recordingTB struct {
	testing.TB
	errors []string
}

func (r *recordingTB) Helper() {}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
