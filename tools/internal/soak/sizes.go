package soak

import (
	"context"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/harvest-run/harvest/internal/pgrow"
)

// hotTables are the tables every start, claim or completion writes.
var hotTables = []string{"runs", "tasks", "fair_state", "fair_arrivals", "fair_queues", "fair_held",
	"tenant_running", "admission_lease", "admission_ledger", "worker_presence"}

// TableSize is one table of one shard at one moment.
type TableSize struct {
	Shard       int    `db:"shard"`
	Table       string `db:"table_name"`
	TableBytes  int64  `db:"table_bytes"`
	IdxBytes    int64  `db:"idx_bytes"`
	Live        int64  `db:"live"`
	Dead        int64  `db:"dead"`
	Autovacuums int64  `db:"autovacuums"`
}

// TableSizes reads the hot tables' sizes, live and dead rows and autovacuum
// runs on every shard (a shard that does not answer is left out).
func (f *Fleet) TableSizes(ctx context.Context) []TableSize {
	var out []TableSize
	for s, p := range f.direct {
		got, err := pgrow.All[TableSize](ctx, p, `SELECT $2::int AS shard, c.relname AS table_name,
			pg_table_size(c.oid) AS table_bytes, pg_indexes_size(c.oid) AS idx_bytes,
			coalesce(st.n_live_tup, 0) AS live, coalesce(st.n_dead_tup, 0) AS dead,
			coalesce(st.autovacuum_count, 0) AS autovacuums
			FROM pg_class c LEFT JOIN pg_stat_user_tables st ON st.relid = c.oid
			WHERE c.relname = ANY($1) AND c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace`, hotTables, s)
		if err != nil {
			continue
		}
		out = append(out, got...)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Shard != out[j].Shard {
			return out[i].Shard < out[j].Shard
		}
		return out[i].Table < out[j].Table
	})
	return out
}

// writeSizes prints the hot tables before and after, per shard.
func writeSizes(out io.Writer, before, after []TableSize) {
	type k struct {
		s int
		t string
	}
	was := map[k]TableSize{}
	for _, t := range before {
		was[k{t.Shard, t.Table}] = t
	}
	fmt.Fprintln(out, "\nhot tables, before the load -> after the check (KiB of table / indexes; live and dead rows; autovacuums):")
	tw := tabwriter.NewWriter(out, 1, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "shard\ttable\ttable KiB\tindex KiB\tlive rows\tdead rows\tautovacuums\t")
	for _, t := range after {
		b := was[k{t.Shard, t.Table}]
		fmt.Fprintf(tw, "%d\t%s\t%d -> %d\t%d -> %d\t%d -> %d\t%d -> %d\t%d\t\n", t.Shard, t.Table,
			b.TableBytes>>10, t.TableBytes>>10, b.IdxBytes>>10, t.IdxBytes>>10, b.Live, t.Live, b.Dead, t.Dead, t.Autovacuums-b.Autovacuums)
	}
	_ = tw.Flush()
}

type sizeSample struct {
	at    time.Duration
	sizes []TableSize
}

// writeSizesOverTime prints, at each memory sample, the two big tables of
// every shard together: their size with indexes and their live and dead
// rows. With retention (7 days by default) far longer than a soak, the
// live rows grow with the runs; the dead ones must not.
func writeSizesOverTime(out io.Writer, samples []sizeSample) {
	fmt.Fprintln(out, "\nruns and tasks over the shards over time (MiB with indexes; live and dead rows; autovacuums so far):")
	tw := tabwriter.NewWriter(out, 1, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "t\truns MiB\truns live\truns dead\ttasks MiB\ttasks live\ttasks dead\tautovacuums\t")
	for _, s := range samples {
		var rb, tb, rl, rd, tl, td, av int64
		for _, t := range s.sizes {
			switch t.Table {
			case "runs":
				rb, rl, rd = rb+t.TableBytes+t.IdxBytes, rl+t.Live, rd+t.Dead
			case "tasks":
				tb, tl, td = tb+t.TableBytes+t.IdxBytes, tl+t.Live, td+t.Dead
			}
			av += t.Autovacuums
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%d\t%d\t%.1f\t%d\t%d\t%d\t\n", s.at, float64(rb)/(1<<20), rl, rd, float64(tb)/(1<<20), tl, td, av)
	}
	_ = tw.Flush()
}

// AutovacuumOff reports whether the shards' server runs without autovacuum.
func (f *Fleet) AutovacuumOff(ctx context.Context) bool {
	var on bool
	err := f.direct[0].QueryRow(ctx, `SELECT current_setting('autovacuum')::boolean`).Scan(&on)
	return err == nil && !on
}

// VacuumRunsAndTasks does autovacuum's work on every shard
// (standInVacuum), for a server that runs without it.
func (f *Fleet) VacuumRunsAndTasks(ctx context.Context) {
	for _, p := range f.direct {
		_, _ = p.Exec(ctx, standInVacuum)
	}
}
