package fleetbench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The floor: what this server does for a queue that is nothing but a
// queue. One table, one row per job, one partial index on the pending
// rows; each loop claims a batch of the fleet's size with FOR UPDATE SKIP
// LOCKED and marks it done in a second statement, both committed
// synchronously as every system here commits. No runs, no leases, no
// counts, no fairness, no process boundary: no real job system can be
// faster on the same server, so Harvest's figure over the floor's says how
// much of the server's capacity its bookkeeping takes.
const (
	floorTable = `CREATE TABLE floor_jobs (id bigserial PRIMARY KEY, state smallint NOT NULL DEFAULT 0)`
	floorIndex = `CREATE INDEX floor_jobs_pending ON floor_jobs (id) WHERE state = 0`
	floorFill  = `INSERT INTO floor_jobs (state) SELECT 0 FROM generate_series(1, $1)`
	floorClaim = `UPDATE floor_jobs SET state = 1 WHERE id IN (
		SELECT id FROM floor_jobs WHERE state = 0 ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING id`
	floorDone = `UPDATE floor_jobs SET state = 2 WHERE id = ANY($1)`
)

// runFloor drains cfg.Flood jobs through the floor loop with as many loops
// as the fleet's workers have claim statements and batches of the fleet's
// claim size, and reports its rate and database cost.
func runFloor(ctx context.Context, cfg *Config) (Result, error) {
	res := Result{Bench: "fleet", System: "floor", Flood: cfg.Flood, Slots: cfg.Workers * cfg.Slots}
	res.Load1[0] = loadAvg()
	dbURL, drop, err := FreshDatabase(ctx, cfg.ServerURL, "harvest_floor_")
	if err != nil {
		return res, err
	}
	defer func() {
		if derr := drop(); derr != nil {
			cfg.logf("fleet: drop database: %v", derr)
		}
	}()
	loops := cfg.Workers * max(1, cfg.Claimers)
	pcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return res, err
	}
	pcfg.MaxConns = int32(loops + 1)
	db, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return res, err
	}
	defer db.Close()
	for _, q := range []string{floorTable, floorIndex} {
		if _, err := db.Exec(ctx, q); err != nil {
			return res, fmt.Errorf("floor: %w", err)
		}
	}
	if _, err := db.Exec(ctx, floorFill, cfg.Flood); err != nil {
		return res, fmt.Errorf("floor: fill: %w", err)
	}
	for _, q := range []string{`VACUUM ANALYZE floor_jobs`, `CHECKPOINT`} {
		if _, err := db.Exec(ctx, q); err != nil {
			return res, fmt.Errorf("floor: %w", err)
		}
	}

	from, err := sampleDB(ctx, db)
	if err != nil {
		return res, err
	}
	batch := max(1, cfg.ClaimBatch)
	var (
		done   atomic.Int64
		wg     sync.WaitGroup
		failed atomic.Pointer[error] // the first error that was not the end of lctx
	)
	lctx, cancel := context.WithTimeout(ctx, cfg.MaxDuration)
	defer cancel()
	start := time.Now()
	for range loops {
		wg.Go(func() {
			ids := make([]int64, 0, batch)
			for lctx.Err() == nil {
				ids = ids[:0]
				rows, err := db.Query(lctx, floorClaim, batch)
				if err == nil {
					ids, err = pgx.AppendRows(ids, rows, pgx.RowTo[int64])
				}
				if err == nil && len(ids) == 0 {
					return
				}
				if err == nil {
					_, err = db.Exec(lctx, floorDone, ids)
				}
				if err != nil {
					// The time ran out, or another loop failed and ended
					// lctx: this loop's error is only that.
					if lctx.Err() == nil {
						failed.CompareAndSwap(nil, &err)
						cancel()
					}
					return
				}
				done.Add(int64(len(ids)))
			}
		})
	}
	wg.Wait()
	drain := time.Since(start)
	if p := failed.Load(); p != nil {
		return res, fmt.Errorf("floor: %w", *p)
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	to, err := sampleDB(ctx, db)
	if err != nil {
		return res, err
	}
	res.Drained = int(done.Load()) == cfg.Flood
	res.DrainS = round(drain.Seconds())
	res.TasksPerS = round(float64(done.Load()) / drain.Seconds())
	res.ClaimBatch = batch
	if err := cost(ctx, db, from, to, int(done.Load()), &res); err != nil {
		return res, err
	}
	res.Load1[1] = loadAvg()
	cfg.logf("fleet: floor: %.0f jobs/s over %.1f s (%d loops, batches of %d)", res.TasksPerS, res.DrainS, loops, batch)
	return res, nil
}
