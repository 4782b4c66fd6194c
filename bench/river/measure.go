package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// figures are read from river_job after the client has stopped, so they do
// not depend on sampling or on when progress was printed.
type figures struct {
	floodCompleted int64
	firstDone      time.Time // earliest finalized_at of any completed job
	lastFloodDone  time.Time // latest finalized_at of a flood job
	completed      int64     // jobs of either kind completed in [firstDone, lastFloodDone]
	lightInserted  int64
	lightWaitsMS   []float64 // attempted_at - scheduled_at of each counted light job
	lightPending   int64     // light jobs inserted during the drain but never attempted
}

func readFigures(ctx context.Context, pool *pgxpool.Pool) (*figures, error) {
	f := &figures{}
	type flood struct {
		Completed int64      `db:"completed"`
		Last      *time.Time `db:"last_done"`
	}
	rows, err := pool.Query(ctx, `
		SELECT count(*) FILTER (WHERE state = 'completed') AS completed,
		       max(finalized_at) FILTER (WHERE state = 'completed') AS last_done
		FROM river_job WHERE kind = $1`, floodKind)
	if err != nil {
		return nil, fmt.Errorf("read flood jobs: %w", err)
	}
	fl, err := pgx.CollectOneRow(rows, pgx.RowToStructByName[flood])
	if err != nil {
		return nil, fmt.Errorf("read flood jobs: %w", err)
	}
	f.floodCompleted = fl.Completed
	last := fl.Last
	if last == nil {
		// Nothing of the flood finished (an undrained run): there is no
		// drain window, and every light job counts as waiting.
		f.lastFloodDone = time.Now()
	} else {
		f.lastFloodDone = *last
		type done struct {
			First     time.Time `db:"first_done"`
			Completed int64     `db:"completed"`
		}
		rows, err := pool.Query(ctx, `
			SELECT min(finalized_at) AS first_done, count(*) AS completed
			FROM river_job WHERE state = 'completed' AND finalized_at <= $1`, f.lastFloodDone)
		if err != nil {
			return nil, fmt.Errorf("read completions: %w", err)
		}
		d, err := pgx.CollectOneRow(rows, pgx.RowToStructByName[done])
		if err != nil {
			return nil, fmt.Errorf("read completions: %w", err)
		}
		f.firstDone, f.completed = d.First, d.Completed
	}

	err = pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = $1`, lightKind).Scan(&f.lightInserted)
	if err != nil {
		return nil, fmt.Errorf("count light jobs: %w", err)
	}

	// Only light jobs that became available while the flood was still
	// draining count: one inserted after the last flood job finished would
	// show a near-zero wait that says nothing about the flood.
	rows, err = pool.Query(ctx, `
		SELECT extract(epoch FROM attempted_at - scheduled_at)::float8 * 1000
		FROM river_job
		WHERE kind = $1 AND scheduled_at <= $2 AND attempted_at IS NOT NULL`, lightKind, f.lastFloodDone)
	if err != nil {
		return nil, fmt.Errorf("read light waits: %w", err)
	}
	if f.lightWaitsMS, err = pgx.CollectRows(rows, pgx.RowTo[float64]); err != nil {
		return nil, fmt.Errorf("read light waits: %w", err)
	}
	err = pool.QueryRow(ctx, `
		SELECT count(*) FROM river_job
		WHERE kind = $1 AND scheduled_at <= $2 AND attempted_at IS NULL`, lightKind, f.lastFloodDone).Scan(&f.lightPending)
	if err != nil {
		return nil, fmt.Errorf("count unattempted light jobs: %w", err)
	}
	return f, nil
}

// percentile returns the nearest-rank percentile (the smallest value with at
// least p% of the values at or below it) of vals, which it sorts in place.
func percentile(vals []float64, p float64) float64 {
	if len(vals) == 0 {
		return 0
	}
	slices.Sort(vals)
	rank := int(math.Ceil(p / 100 * float64(len(vals))))
	rank = min(max(rank, 1), len(vals))
	return vals[rank-1]
}

// peakRSSMB reads the process's resident-set high-water mark (VmHWM) in MiB.
func peakRSSMB() (float64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "VmHWM:") {
			continue
		}
		fields := strings.Fields(strings.TrimPrefix(line, "VmHWM:"))
		if len(fields) < 1 {
			break
		}
		kb, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, fmt.Errorf("parse VmHWM %q: %w", line, err)
		}
		return kb / 1024, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no VmHWM line in /proc/self/status")
}

// round rounds x to d decimals, for a readable JSON line.
func round(x float64, d int) float64 {
	p := math.Pow(10, float64(d))
	return math.Round(x*p) / p
}
