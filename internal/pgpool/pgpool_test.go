package pgpool_test

import (
	"context"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/harvest-run/harvest/internal/dberr"
	"github.com/harvest-run/harvest/internal/pgpool"
	"github.com/harvest-run/harvest/internal/testsvc"
)

var metricReader = sdkmetric.NewManualReader()

func TestMain(m *testing.M) {
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(metricReader)))
	testsvc.Main(m)
}

// bundle is one test's database and a pool on it from pgpool.New.
type bundle struct {
	t     *testing.T
	ctx   context.Context
	url   string
	shard int
	pool  *pgxpool.Pool
	admin *pgx.Conn
}

// shards hands every pool of the tests a shard label of its own, so that
// each test reads its own count of resets (also with -count).
var shards atomic.Int64

// setup opens a pool of three connections, with a shard label of its own,
// on a fresh database, and a plain connection to administer it.
func setup(t *testing.T) *bundle {
	t.Helper()
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	dbURL := testsvc.NewEmptyDBURL(t)
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.MaxConns = 3
	shard := int(shards.Add(1))
	pool, err := pgpool.New(ctx, shard, "", cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	admin, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	return &bundle{t: t, ctx: ctx, url: dbURL, shard: shard, pool: pool, admin: admin}
}

// hold acquires every connection of the pool at once and returns them
// with their backends' pids. Releasing one twice does no harm.
func (b *bundle) hold() ([]*pgxpool.Conn, []uint32) {
	b.t.Helper()
	var conns []*pgxpool.Conn
	var pids []uint32
	for range int(b.pool.Config().MaxConns) {
		c, err := b.pool.Acquire(b.ctx)
		require.NoError(b.t, err)
		// A failed test must not leave the pool's Close waiting for it.
		b.t.Cleanup(c.Release)
		conns = append(conns, c)
		pids = append(pids, c.Conn().PgConn().PID())
	}
	return conns, pids
}

func release(conns []*pgxpool.Conn) {
	for _, c := range conns {
		c.Release()
	}
}

// resets reads harvest.pgx.pool.resets of shard.
func resets(t *testing.T, shard int) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, metricReader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "harvest.pgx.pool.resets" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if v, _ := dp.Attributes.Value(attribute.Key("shard")); v.AsString() == strconv.Itoa(shard) {
					return dp.Value
				}
			}
		}
	}
	return 0
}

// After a switchover a pooled connection may still be open to the old
// primary, now read-only: its write fails with 25006. That connection is
// closed, and every other connection the pool had is retired with it (they
// all went to the same server), so the next statements run on new
// connections, which go through target_session_attrs.
func TestReadOnlyConnectionRetiresThePool(t *testing.T) {
	b := setup(t)
	conns, old := b.hold()
	// This connection's server now refuses writes, as a demoted primary
	// does.
	_, err := conns[0].Exec(b.ctx, "SET default_transaction_read_only = on")
	require.NoError(t, err)
	_, err = conns[0].Exec(b.ctx, "CREATE TABLE t (i int)")
	require.Equal(t, dberr.CodeReadOnly, dberr.Code(err), "%v", err)
	require.True(t, conns[0].Conn().IsClosed(), "the read-only connection is closed at once")
	release(conns)

	conns, fresh := b.hold()
	defer release(conns)
	for _, pid := range fresh {
		require.NotContains(t, old, pid, "a connection opened before the read-only answer was handed out again")
	}
	_, err = conns[0].Exec(b.ctx, "CREATE TABLE t (i int)")
	require.NoError(t, err)
	require.EqualValues(t, 1, resets(t, b.shard))
}

// A server shutting down (a switchover stops the old primary in fast mode)
// ends each session with FATAL 57P01. The first connection that reads it
// retires the pool's other connections, idle or busy, without each having
// to fail a statement first.
func TestShutdownRetiresIdleAndBusyConnections(t *testing.T) {
	b := setup(t)
	conns, old := b.hold()
	_, err := b.admin.Exec(b.ctx, "SELECT pg_terminate_backend($1)", old[0])
	require.NoError(t, err)
	// The backend has sent its FATAL once it is gone.
	require.Eventually(t, func() bool {
		var n int
		return b.admin.QueryRow(b.ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", old[0]).Scan(&n) == nil && n == 0
	}, 10*time.Second, 10*time.Millisecond)
	_, err = conns[0].Exec(b.ctx, "SELECT 1")
	require.Equal(t, dberr.CodeAdminShutdown, dberr.Code(err), "%v", err)
	// conns[1] is released (idle); conns[2] stays busy a little longer and
	// still works meanwhile.
	conns[0].Release()
	conns[1].Release()
	_, err = conns[2].Exec(b.ctx, "SELECT 1")
	require.NoError(t, err)
	conns[2].Release()

	conns, fresh := b.hold()
	defer release(conns)
	for _, pid := range fresh {
		require.NotContains(t, old, pid, "a connection opened before the shutdown was handed out again")
	}
	require.EqualValues(t, 1, resets(t, b.shard))
}

// With no target_session_attrs in the URL, a pool from New asks for a
// server that takes writes: a read-only server is refused when
// connecting (an unavailable shard), not accepted to fail every write. An
// explicit target is kept.
func TestNewAsksForAWritableServer(t *testing.T) {
	b := setup(t)
	db := b.admin.Config().Database
	_, err := b.admin.Exec(b.ctx, "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET default_transaction_read_only = on")
	require.NoError(t, err)

	_, err = b.pool.Exec(b.ctx, "SELECT 1")
	var ce *pgconn.ConnectError
	require.ErrorAs(t, err, &ce, "a read-only server is refused")
	_, err = pgpool.Connect(b.ctx, b.url)
	require.ErrorAs(t, err, &ce, "Connect refuses it too")

	u, err := url.Parse(b.url)
	require.NoError(t, err)
	q := u.Query()
	q.Set("target_session_attrs", "any")
	u.RawQuery = q.Encode()
	cfg, err := pgxpool.ParseConfig(u.String())
	require.NoError(t, err)
	anyPool, err := pgpool.New(b.ctx, int(shards.Add(1)), "", cfg)
	require.NoError(t, err)
	defer anyPool.Close()
	_, err = anyPool.Exec(b.ctx, "SELECT 1")
	require.NoError(t, err, "target_session_attrs=any, chosen on purpose, is kept")

	_, err = b.admin.Exec(b.ctx, "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" RESET default_transaction_read_only")
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, "CREATE TABLE t (i int)")
	require.NoError(t, err, "the same pool connects once the server takes writes")
}

// A pool that asks for a writable server retires its connections as soon
// as one of them learns that its server turned read-only, even from a
// statement that only reads: PostgreSQL reports the change of
// default_transaction_read_only with the statement's answer. So readers
// do not stay on the old primary after a switchover either; the idle
// connections are closed at once, without being acquired.
func TestReadOnlyReportRetiresIdleConnections(t *testing.T) {
	b := setup(t)
	conns, old := b.hold()
	release(conns[1:])
	_, err := conns[0].Exec(b.ctx, "SET default_transaction_read_only = on")
	require.NoError(t, err)
	_, err = conns[0].Exec(b.ctx, "SELECT 1")
	require.NoError(t, err, "reads still work there")
	conns[0].Release()

	require.Eventually(t, func() bool {
		var n int
		return b.admin.QueryRow(b.ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)", old).Scan(&n) == nil && n == 0
	}, 10*time.Second, 10*time.Millisecond, "every connection of the pool to the read-only server is closed")
	require.EqualValues(t, 1, resets(t, b.shard))
}

// A readiness probe's pool only pings, and a plain ping passes on a
// read-only server: Ping asks whether the server takes writes, fails on a
// read-only one, and retires that connection, so the next probe reaches a
// writable server. (With target_session_attrs=any the pool keeps read-only
// sessions otherwise, which isolates Ping's own check here.)
func TestPingFailsOnAReadOnlyServer(t *testing.T) {
	b := setup(t)
	cfg, err := pgxpool.ParseConfig(withParam(t, b.url, "target_session_attrs", "any"))
	require.NoError(t, err)
	pool, err := pgpool.New(b.ctx, b.shard, "", cfg)
	require.NoError(t, err)
	defer pool.Close()
	c, err := pool.Acquire(b.ctx)
	require.NoError(t, err)
	_, err = c.Exec(b.ctx, "SET default_transaction_read_only = on")
	require.NoError(t, err)
	pid := c.Conn().PgConn().PID()
	c.Release()
	// pgxpool puts a released connection back from a goroutine of its own.
	require.Eventually(t, func() bool { return pool.Stat().IdleConns() == 1 }, 10*time.Second, time.Millisecond)

	err = pgpool.Ping(b.ctx, pool)
	require.Equal(t, dberr.CodeReadOnly, dberr.Code(err), "%v", err)
	require.NoError(t, pgpool.Ping(b.ctx, pool))
	c, err = pool.Acquire(b.ctx)
	require.NoError(t, err)
	defer c.Release()
	require.NotEqual(t, pid, c.Conn().PgConn().PID())
	require.EqualValues(t, 1, resets(t, b.shard))
}

// A single connection from Connect is closed by a read-only answer, so a
// command that holds it stops instead of sending more writes to it.
func TestConnectClosesOnReadOnly(t *testing.T) {
	b := setup(t)
	conn, err := pgpool.Connect(b.ctx, b.url)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(b.ctx, "SET default_transaction_read_only = on")
	require.NoError(t, err)
	_, err = conn.Exec(b.ctx, "CREATE TABLE t (i int)")
	require.Equal(t, dberr.CodeReadOnly, dberr.Code(err), "%v", err)
	require.True(t, conn.IsClosed())
}

// A pool's connections carry the application name it was opened with, so
// that the server's views tell a gateway's work from a worker's; a name the
// connection string gives is kept, and none is set for "".
func TestNewNamesTheConnections(t *testing.T) {
	b := setup(t)
	for _, c := range []struct{ url, app, want string }{
		{b.url, pgpool.AppWorker, "harvest-worker"},
		{b.url, pgpool.AppGateway, "harvest-gateway"},
		{withParam(t, b.url, "application_name", "mine"), pgpool.AppWorker, "mine"},
		{b.url, "", ""},
	} {
		cfg, err := pgxpool.ParseConfig(c.url)
		require.NoError(t, err)
		pool, err := pgpool.New(b.ctx, b.shard, c.app, cfg)
		require.NoError(t, err)
		var got string
		err = pool.QueryRow(b.ctx, `SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()`).Scan(&got)
		pool.Close()
		require.NoError(t, err)
		require.Equal(t, c.want, got, "app %q, url %s", c.app, c.url)
	}
}

// withParam is rawURL with the query parameter key set to value.
func withParam(t *testing.T, rawURL, key, value string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}
