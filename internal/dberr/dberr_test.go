package dberr_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/dberr"
	"github.com/harvest-run/harvest/internal/testsvc"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

// verdict is what every predicate says of one error.
type verdict struct {
	conflict, retryable, unavailable, unreachable, primaryLost bool
}

var (
	none        = verdict{}
	conflict    = verdict{conflict: true, retryable: true}
	unavailable = verdict{unavailable: true}
	lost        = verdict{unavailable: true, primaryLost: true}
	noServer    = verdict{unavailable: true, unreachable: true}
)

// raise has the server answer with an error of SQLSTATE code, as a SQL
// function of the schema does (RAISE ... USING ERRCODE).
func raise(code string) func(*testing.T, *pgxpool.Pool) error {
	return func(t *testing.T, db *pgxpool.Pool) error {
		_, err := db.Exec(t.Context(), fmt.Sprintf(
			`DO $$ BEGIN RAISE EXCEPTION 'raised by the test' USING ERRCODE = '%s'; END $$`, code))
		return err
	}
}

// closedPort is an address where nothing listens.
func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// Every predicate of the package over errors as the code meets them: the
// server's own answers (through pgx, the codes raised as the schema's
// functions raise them, and statements that fail for real), connections
// that fail, close or time out, and the network's errors, bare and
// wrapped. The table is the contract the call sites rely on (the gateway's
// 503, pkg/weights' ErrUnavailable and ErrRetry, the retries of the
// request paths and of the background work, the pool's reset, the test
// harness's fallback server).
func TestClassifiesRealErrors(t *testing.T) {
	t.Parallel()
	db := testsvc.NewDB(t)
	serverURL := testsvc.ServerURL(t)
	cases := []struct {
		name string
		err  func(*testing.T, *pgxpool.Pool) error
		code string
		want verdict
	}{
		{"nil", func(*testing.T, *pgxpool.Pool) error { return nil }, "", none},
		{"an error of the code's own", func(*testing.T, *pgxpool.Pool) error { return errors.New("no") }, "", none},

		// The database broke the transaction on purpose.
		{"deadlock", raise(dberr.CodeDeadlock), dberr.CodeDeadlock, conflict},
		{"serialization failure", raise(dberr.CodeSerialization), dberr.CodeSerialization, conflict},
		{"deadlock, wrapped", func(t *testing.T, db *pgxpool.Pool) error {
			return fmt.Errorf("store: start: %w", raise(dberr.CodeDeadlock)(t, db))
		}, dberr.CodeDeadlock, conflict},

		// A server that is no longer the writable primary.
		{"read-only", raise(dberr.CodeReadOnly), dberr.CodeReadOnly,
			verdict{retryable: true, unavailable: true, primaryLost: true}},
		{"admin shutdown", raise(dberr.CodeAdminShutdown), dberr.CodeAdminShutdown, lost},
		{"crash shutdown", raise(dberr.CodeCrashShutdown), dberr.CodeCrashShutdown, lost},
		{"cannot connect now", raise(dberr.CodeCannotConnectNow), dberr.CodeCannotConnectNow, lost},
		{"backend terminated", func(t *testing.T, db *pgxpool.Pool) error {
			c, err := db.Acquire(t.Context())
			require.NoError(t, err)
			defer c.Release()
			_, err = db.Exec(t.Context(), `SELECT pg_terminate_backend($1)`, c.Conn().PgConn().PID())
			require.NoError(t, err)
			_, err = c.Exec(t.Context(), `SELECT 1`)
			return err
		}, dberr.CodeAdminShutdown, lost},

		// Other states of the shard, not of the statement.
		{"too many connections", raise(dberr.CodeTooManyConnections), dberr.CodeTooManyConnections, unavailable},
		{"disk full", raise("53100"), "53100", unavailable},
		{"connection failure", raise("08006"), "08006", unavailable},
		{"operator intervention", raise("57000"), "57000", unavailable},

		// The statement itself was refused.
		{"statement timeout", func(t *testing.T, db *pgxpool.Pool) error {
			tx, err := db.Begin(t.Context())
			require.NoError(t, err)
			defer tx.Rollback(t.Context()) //nolint:errcheck // the statement failed
			_, err = tx.Exec(t.Context(), `SET LOCAL statement_timeout = '10ms'`)
			require.NoError(t, err)
			_, err = tx.Exec(t.Context(), `SELECT pg_sleep(5)`)
			return err
		}, dberr.CodeQueryCanceled, none},
		{"unique violation", func(t *testing.T, db *pgxpool.Pool) error {
			_, err := db.Exec(t.Context(), `CREATE TABLE t_unique (id int PRIMARY KEY)`)
			require.NoError(t, err)
			_, err = db.Exec(t.Context(), `INSERT INTO t_unique VALUES (1), (1)`)
			return err
		}, dberr.CodeUniqueViolation, none},
		{"untranslatable character", func(t *testing.T, db *pgxpool.Pool) error {
			_, err := db.Exec(t.Context(), `SELECT '"\u0000"'::jsonb`)
			return err
		}, dberr.CodeUntranslatableCharacter, none},
		{"undefined function", func(t *testing.T, db *pgxpool.Pool) error {
			_, err := db.Exec(t.Context(), `SELECT harvest_no_such_function()`)
			return err
		}, dberr.CodeUndefinedFunction, none},
		{"Harvest's stale lease", raise(dberr.CodeStaleLease), dberr.CodeStaleLease, none},
		{"Harvest's tenant moved", raise(dberr.CodeTenantMoved), dberr.CodeTenantMoved, none},

		// No answer from a server.
		{"connection refused", func(t *testing.T, _ *pgxpool.Pool) error {
			_, err := pgx.Connect(t.Context(), "postgres://postgres@"+closedPort(t)+"/x?sslmode=disable&connect_timeout=5")
			return err
		}, "", noServer},
		{"no such socket", func(t *testing.T, _ *pgxpool.Pool) error {
			_, err := pgx.Connect(t.Context(), "host="+t.TempDir()+" user=postgres sslmode=disable connect_timeout=5")
			return err
		}, "", noServer},
		{"deadline during a statement", func(t *testing.T, db *pgxpool.Pool) error {
			ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer cancel()
			_, err := db.Exec(ctx, `SELECT pg_sleep(5)`)
			return err
		}, "", noServer},
		{"connection closed under the caller", func(t *testing.T, _ *pgxpool.Pool) error {
			conn, err := pgx.Connect(t.Context(), serverURL)
			require.NoError(t, err)
			require.NoError(t, conn.Close(t.Context()))
			_, err = conn.Exec(t.Context(), `SELECT 1`)
			return err
		}, "", unavailable},
		{"caller's context cancelled", func(t *testing.T, db *pgxpool.Pool) error {
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			_, err := db.Exec(ctx, `SELECT 1`)
			return err
		}, "", unavailable},

		// A server that answered at connect time is there.
		{"no such database", func(t *testing.T, _ *pgxpool.Pool) error {
			cfg, err := pgx.ParseConfig(serverURL)
			require.NoError(t, err)
			cfg.Database = "harvest_no_such_database"
			_, err = pgx.ConnectConfig(t.Context(), cfg)
			return err
		}, "3D000", none},

		// The network's errors, bare.
		{"reset", func(*testing.T, *pgxpool.Pool) error {
			return fmt.Errorf("read: %w", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)})
		}, "", noServer},
		{"name does not resolve", func(*testing.T, *pgxpool.Pool) error {
			return &net.DNSError{Err: "no such host", Name: "shard.invalid", IsNotFound: true}
		}, "", unavailable},
		{"deadline", func(*testing.T, *pgxpool.Pool) error {
			return errors.Join(errors.New("x"), context.DeadlineExceeded)
		}, "", noServer},
	}
	for _, tc := range cases {
		err := tc.err(t, db)
		if tc.name != "nil" && tc.name != "an error of the code's own" {
			require.Error(t, err, tc.name)
		}
		got := verdict{
			conflict:    dberr.Conflict(err),
			retryable:   dberr.Retryable(err),
			unavailable: dberr.Unavailable(err),
			unreachable: dberr.Unreachable(err),
			primaryLost: dberr.PrimaryLost(dberr.Code(err)),
		}
		require.Equal(t, tc.want, got, "%s: %v", tc.name, err)
		require.Equal(t, tc.code, dberr.Code(err), "%s: %v", tc.name, err)
	}
}
