package fleetbench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// clockTicks is the unit of the CPU times in /proc/<pid>/stat. Linux has
// reported them at 100 per second on every common architecture for
// decades (USER_HZ), whatever the kernel's own tick rate.
const clockTicks = 100

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
	s.cpu = postgresCPU()
	return s, nil
}

func postgresCPU() time.Duration {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	type proc struct {
		ppid              int
		own, reapedByThis int64
	}
	procs := map[int]proc{}
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... : comm may hold spaces, so split after
		// the last parenthesis.
		open, shut := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
		if open < 0 || shut < open || string(b[open+1:shut]) != "postgres" {
			continue
		}
		f := bytes.Fields(b[shut+1:])
		// After comm: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
		if len(f) < 15 {
			continue
		}
		num := func(i int) int64 { v, _ := strconv.ParseInt(string(f[i]), 10, 64); return v }
		pid, _ := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
		procs[pid] = proc{ppid: int(num(1)), own: num(11) + num(12), reapedByThis: num(13) + num(14)}
	}
	var ticks int64
	for _, p := range procs {
		ticks += p.own
		if _, child := procs[p.ppid]; !child {
			ticks += p.reapedByThis // the postmaster
		}
	}
	return time.Duration(ticks) * time.Second / clockTicks
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
