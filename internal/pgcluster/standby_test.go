package pgcluster

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// A synchronous standby has every commit the primary acknowledged; killed
// primary, promoted standby: the row is there, the standby takes writes,
// and a URL naming both servers with target_session_attrs=read-write
// reaches it.
func TestStandbyPromotedAfterThePrimaryDies(t *testing.T) {
	t.Parallel()
	if _, err := FindBinaries(); err != nil {
		t.Skipf("no PostgreSQL server binaries: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	opts := Options{Logf: t.Logf, MaxConnections: 20, Settings: map[string]string{"synchronous_commit": "on"}}
	primary, err := Start(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = primary.Stop(context.Background()) })

	plain, err := Start(ctx, Options{MaxConnections: 20})
	require.NoError(t, err)
	t.Cleanup(func() { _ = plain.Stop(context.Background()) })
	_, err = plain.StartStandby(ctx, Options{MaxConnections: 20}, StandbyOptions{Synchronous: true})
	require.ErrorContains(t, err, "synchronous_commit", "a primary that would not wait for its standby")

	standby, err := primary.StartStandby(ctx, opts, StandbyOptions{Synchronous: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = standby.Stop(context.Background()) })
	var inRecovery bool
	require.NoError(t, standby.query(ctx, "SELECT pg_is_in_recovery()", &inRecovery))
	require.True(t, inRecovery)

	both := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		primary.Port(), standby.Port())
	conn, err := pgx.Connect(ctx, both)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE acked (i int); INSERT INTO acked VALUES (1)")
	require.NoError(t, err)
	require.Equal(t, primary.Port(), conn.PgConn().Conn().RemoteAddr().(*net.TCPAddr).Port, "the primary, the one taking writes")
	_ = conn.Close(ctx)

	require.NoError(t, primary.Kill(ctx))
	require.NoError(t, standby.Promote(ctx))
	conn, err = pgx.Connect(ctx, both)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM acked").Scan(&n))
	require.Equal(t, 1, n, "the acknowledged commit survived the primary")
	_, err = conn.Exec(ctx, "INSERT INTO acked VALUES (2)")
	require.NoError(t, err)
}
