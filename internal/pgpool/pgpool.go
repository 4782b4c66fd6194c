package pgpool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/harvest-run/harvest/internal/dberr"
)

const instrumentation = "github.com/harvest-run/harvest/internal/pgpool"

// The application names of the binaries' pools (see New).
const (
	AppGateway = "harvest-gateway"
	AppWorker  = "harvest-worker"
	AppCLI     = "harvest"
)

// generationKey is where a connection keeps, in its pgconn custom data,
// the pool generation it was opened in.
const generationKey = "harvest/pgpool.generation"

// New opens a pool on a shard from cfg (see pgxpool.ParseConfig; cfg is
// copied, not changed) that follows a change of the shard's primary:
//
//   - unless the connection string or PGTARGETSESSIONATTRS names a
//     target_session_attrs, new connections ask for read-write, so with
//     several hosts only the one accepting writes is kept;
//   - a connection that gets SQLSTATE 25006 is closed at once (Postgres
//     itself closes on the shutdown codes);
//   - when a connection reports its server read-only or going away (an
//     error code of dberr.PrimaryLost, or, with target read-write, the server's
//     own report that default_transaction_read_only turned on, which
//     PostgreSQL 14 and later send after any statement, a read included),
//     every connection the pool opened until then is retired: the idle
//     ones are closed at once, the busy ones when released. The
//     connections opened instead go through target_session_attrs again.
//     harvest.pgx.pool.resets counts these resets.
//
// shard labels the metric. app names the pool's connections to the server
// (application_name: pg_stat_activity, the server's log and its CPU per
// backend tell a gateway's work from a worker's by it) unless the
// connection string or PGAPPNAME named them already; "" leaves them
// unnamed. Every pool a Harvest binary keeps on a shard is opened here.
func New(ctx context.Context, shard int, app string, cfg *pgxpool.Config) (*pgxpool.Pool, error) {
	cfg = cfg.Copy()
	if _, named := cfg.ConnConfig.RuntimeParams["application_name"]; !named && app != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = app
	}
	f := &failover{}
	if c, err := otel.Meter(instrumentation).Int64Counter("harvest.pgx.pool.resets",
		metric.WithDescription("Times a pool retired every connection it had because one of them found its server read-only or shutting down (SQLSTATE 25006, 57P01-57P03): a failover or switchover of the shard's primary, or a backend terminated by hand."),
		metric.WithUnit("{reset}")); err == nil {
		f.resets = c
		f.attrs = metric.WithAttributeSet(attribute.NewSet(attribute.String("shard", strconv.Itoa(shard))))
	}
	f.install(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgpool: %w", err)
	}
	f.pool.Store(pool)
	return pool, nil
}

// Connect opens one connection (for commands that need no pool) with the
// same target as New and the same closing on SQLSTATE 25006.
func Connect(ctx context.Context, connString string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	writable(cfg)
	cfg.OnPgError = closeOnLost(cfg.OnPgError, nil)
	return pgx.ConnectConfig(ctx, cfg)
}

// Ping checks that pool's shard answers and takes writes, for readiness
// probes. A plain ping passes on a connection left open to a demoted
// primary, so Ping asks the server whether it is read-only, and if it is,
// handles the connection as a write refused with 25006 would be (closed,
// the pool's older connections retired). It returns that 25006.
func Ping(ctx context.Context, pool *pgxpool.Pool) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	pc := c.Conn().PgConn()
	err = pgconn.ValidateConnectTargetSessionAttrsReadWrite(ctx, pc)
	if errors.Is(err, pgconn.ErrReadOnlyConnection) {
		pe := &pgconn.PgError{Severity: "ERROR", Code: dberr.CodeReadOnly, Message: "the server is read-only"}
		if h := c.Conn().Config().OnPgError; h == nil || !h(pc, pe) {
			_ = pc.Close(ctx)
		}
		return fmt.Errorf("pgpool: %w", pe)
	}
	return err
}

// writable asks for target_session_attrs=read-write unless the
// connection string or the environment chose a target.
func writable(cfg *pgx.ConnConfig) {
	if cfg.ValidateConnect != nil || strings.Contains(cfg.ConnString(), "target_session_attrs") ||
		os.Getenv("PGTARGETSESSIONATTRS") != "" {
		return
	}
	cfg.ValidateConnect = pgconn.ValidateConnectTargetSessionAttrsReadWrite
}

// readWrite reports whether fn is pgx's check of target_session_attrs=read-write.
func readWrite(fn pgconn.ValidateConnectFunc) bool {
	return fn != nil && reflect.ValueOf(fn).Pointer() == reflect.ValueOf(pgconn.ValidateConnectTargetSessionAttrsReadWrite).Pointer()
}

// closeOnLost wraps a pgconn error handler (nil: pgconn's default, which
// closes on FATAL) so that a connection is also closed on 25006, and calls
// lost, when set, for every code dberr.PrimaryLost names.
func closeOnLost(prev pgconn.PgErrorHandler, lost func(*pgconn.PgConn)) pgconn.PgErrorHandler {
	return func(pc *pgconn.PgConn, pe *pgconn.PgError) bool {
		keep := !strings.EqualFold(pe.Severity, "FATAL")
		if prev != nil {
			keep = prev(pc, pe)
		}
		if !dberr.PrimaryLost(pe.Code) {
			return keep
		}
		if lost != nil {
			lost(pc)
		}
		return false
	}
}

// failover is one pool's generation counter: a connection belongs to the
// generation current when it was opened, and is used only while that is
// still the current one.
type failover struct {
	gen  atomic.Uint64
	pool atomic.Pointer[pgxpool.Pool]
	// writer: the pool's target is read-write, so a session whose server
	// reports itself read-only is retired too.
	writer bool
	resets metric.Int64Counter
	attrs  metric.MeasurementOption
}

func (f *failover) install(cfg *pgxpool.Config) {
	writable(cfg.ConnConfig)
	cc := &cfg.ConnConfig.Config
	validate := cc.ValidateConnect
	f.writer = readWrite(validate)
	cc.ValidateConnect = func(ctx context.Context, pc *pgconn.PgConn) error {
		// Read before the server is asked whether it takes writes: a
		// reset after this point makes the connection old, never the
		// other way round.
		pc.CustomData()[generationKey] = f.gen.Load()
		if validate == nil {
			return nil // target_session_attrs=any, chosen on purpose
		}
		return validate(ctx, pc)
	}
	cc.OnPgError = closeOnLost(cc.OnPgError, f.lost)

	// A caller's PrepareConn runs after this one (the deprecated
	// BeforeAcquire would be ignored beside it: Harvest sets neither).
	prepare := cfg.PrepareConn
	cfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
		if !f.usable(c) {
			return false, nil // pgxpool closes it and takes or opens another
		}
		if prepare != nil {
			return prepare(ctx, c)
		}
		return true, nil
	}
	release := cfg.AfterRelease
	cfg.AfterRelease = func(c *pgx.Conn) bool {
		if !f.usable(c) {
			return false
		}
		return release == nil || release(c)
	}
}

// usable reports whether c belongs to the current generation and, in a
// writer's pool, its server has not reported itself read-only (which
// retires the generation).
func (f *failover) usable(c *pgx.Conn) bool {
	pc := c.PgConn()
	if f.writer && (pc.ParameterStatus("default_transaction_read_only") == "on" || pc.ParameterStatus("in_hot_standby") == "on") {
		f.lost(pc)
		return false
	}
	g, ok := pc.CustomData()[generationKey].(uint64)
	return ok && g == f.gen.Load()
}

// lost retires the generation of pc, unless a newer one was already begun
// (by another connection that saw the same failover first), and closes
// the pool's idle connections of the old one.
func (f *failover) lost(pc *pgconn.PgConn) {
	g, ok := pc.CustomData()[generationKey].(uint64)
	if !ok || !f.gen.CompareAndSwap(g, g+1) {
		return // an error while connecting, or a generation already retired
	}
	if f.resets != nil {
		f.resets.Add(context.Background(), 1, f.attrs)
	}
	if p := f.pool.Load(); p != nil {
		// Not here: lost runs inside a statement of a connection of the
		// pool. AcquireAllIdle hands every idle connection to PrepareConn,
		// which closes the retired ones; any opened since are released.
		go func() {
			for _, c := range p.AcquireAllIdle(context.Background()) {
				c.Release()
			}
		}()
	}
}
