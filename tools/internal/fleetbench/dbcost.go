package fleetbench

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/tools/internal/child"
)

// dbSample is what the database server had spent at one moment: the CPU
// time of its processes and the WAL it had written. Both are counted for
// the whole server, so a window measures one system only while nothing
// else uses the server.
type dbSample struct {
	cpu time.Duration // zero when no PostgreSQL process is visible here
	lsn string
}

// sampleDB reads the server's WAL position and, when the server runs on
// this machine, the CPU time of its processes from /proc: every postgres
// process's own time plus, for the postmaster, the time of the children it
// has reaped, so backends that end inside the window still count.
func sampleDB(ctx context.Context, db *pgxpool.Pool) (dbSample, error) {
	var s dbSample
	if err := db.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&s.lsn); err != nil {
		return s, err
	}
	s.cpu = child.PostgresCPU()
	return s, nil
}

// cost fills the run's database CPU and WAL per task from two samples.
func cost(ctx context.Context, db *pgxpool.Pool, from, to dbSample, tasks int, res *Result) error {
	if tasks <= 0 {
		return nil
	}
	var wal float64
	if err := db.QueryRow(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)`, to.lsn, from.lsn).Scan(&wal); err != nil {
		return err
	}
	res.WALBytesPerTask = round(wal / float64(tasks))
	if from.cpu > 0 {
		res.DBCPUPerTaskUS = round(float64((to.cpu - from.cpu).Microseconds()) / float64(tasks))
	}
	return nil
}

// appCPU is the CPU time the processes pids have used so far (those that
// are gone count zero).
func appCPU(pids ...int) time.Duration {
	var d time.Duration
	for _, pid := range pids {
		d += child.CPU(pid)
	}
	return d
}

// appCost fills the run's CPU of its own processes per task from two
// readings of appCPU.
func appCost(from, to time.Duration, tasks int, res *Result) {
	if tasks > 0 && to > from {
		res.AppCPUPerTaskUS = round(float64((to - from).Microseconds()) / float64(tasks))
	}
}
