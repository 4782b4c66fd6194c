package fleetbench

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

// The floor drains every job exactly once and reports its cost.
func TestFloorDrainsEveryJob(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := &Config{ServerURL: testsvc.ServerURL(t), Flood: 2000, Workers: 2, Slots: 10, ClaimBatch: 7,
		Claimers: 2, MaxDuration: time.Minute}
	res, err := runFloor(ctx, cfg)
	require.NoError(t, err)
	require.True(t, res.Drained, "every job claimed and done")
	require.Positive(t, res.TasksPerS)
	require.Positive(t, res.WALBytesPerTask, "two updates per job write WAL")
}

// The server the tests use runs on this machine (a throwaway cluster or
// the local one), so its processes' CPU time is visible and grows with
// work.
func TestSampleCountsTheServersCPU(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := pgxpool.New(ctx, testsvc.ServerURL(t))
	require.NoError(t, err)
	defer db.Close()
	from, err := sampleDB(ctx, db)
	require.NoError(t, err)
	require.Positive(t, from.cpu)
	_, err = db.Exec(ctx, `SELECT count(*) FROM generate_series(1, 3000000)`)
	require.NoError(t, err)
	to, err := sampleDB(ctx, db)
	require.NoError(t, err)
	require.Greater(t, to.cpu-from.cpu, 50*time.Millisecond, "the query's CPU time is counted")
}
