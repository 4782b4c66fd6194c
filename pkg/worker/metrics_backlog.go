package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// backlogTimeout bounds the transaction that reads the backlog gauges'
// figures at each collection.
const backlogTimeout = 2 * time.Second

// BacklogMetrics registers two gauges read from the shard at each metrics
// collection (each scrape of /metrics):
//
//   - harvest.queue.depth{shard, queue, state}: tasks of each of queues
//     that are waiting (state "pending": due, or "scheduled": due later)
//     or held by a worker ("running").
//   - harvest.runs.unfinished{shard}: the shard's unfinished runs, the
//     total of its tenants' running counts (what admission counts).
//
// Each state of a queue is counted through its own partial index, so a
// collection costs in proportion to the tasks that wait or run, never to
// the finished ones the shard keeps until retention deletes them.
//
// Every worker of a shard reports the same figures, so dashboards should
// take max by (shard, queue), not a sum. Labels stay bounded: queue names
// come from the worker's configuration. Call the returned function to
// stop reporting.
func BacklogMetrics(db *pgxpool.Pool, shard int, queues []string) (unregister func() error, err error) {
	m := otel.Meter(instrumentation)
	depth, err := m.Int64ObservableGauge("harvest.queue.depth",
		metric.WithDescription("tasks of a queue on a shard that wait (pending, scheduled) or run"),
		metric.WithUnit("{task}"))
	if err != nil {
		return nil, fmt.Errorf("worker: metrics: %w", err)
	}
	unfinished, err := m.Int64ObservableGauge("harvest.runs.unfinished",
		metric.WithDescription("unfinished runs on a shard (the sum of the tenants' running counts)"),
		metric.WithUnit("{run}"))
	if err != nil {
		return nil, fmt.Errorf("worker: metrics: %w", err)
	}
	qs := append([]string(nil), queues...)
	shardAttr := attribute.Int("shard", shard)
	reg, err := m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, backlogTimeout)
		defer cancel()
		tx, err := db.Begin(ctx)
		if err != nil {
			return fmt.Errorf("worker: backlog: %w", err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op after the commit
		depths, total, err := readBacklog(ctx, tx, qs)
		if err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("worker: backlog: %w", err)
		}
		for _, d := range depths {
			for _, st := range []struct {
				state string
				n     int64
			}{{"pending", d.Pending}, {"scheduled", d.Scheduled}, {"running", d.Running}} {
				o.ObserveInt64(depth, st.n, metric.WithAttributes(shardAttr,
					attribute.String("queue", d.Queue), attribute.String("state", st.state)))
			}
		}
		o.ObserveInt64(unfinished, total, metric.WithAttributes(shardAttr))
		return nil
	}, depth, unfinished)
	if err != nil {
		return nil, fmt.Errorf("worker: metrics: %w", err)
	}
	return reg.Unregister, nil
}

// queueDepth is one queue's row of QueueDepth: its tasks by state.
type queueDepth struct {
	Queue     string `db:"queue"`
	Pending   int64  `db:"pending"`
	Scheduled int64  `db:"scheduled"`
	Running   int64  `db:"running"`
}

// readBacklog reads the gauges' figures in tx: the tasks of each of queues
// by state, and the shard's unfinished runs. It turns sequential scans off
// for the rest of tx. Statistics taken while a big backlog was pending make
// a (parallel) scan of tasks look cheaper than the partial indexes, and
// once that backlog has been worked off the table holds mostly finished
// rows: the scan would read all of them at every scrape until the next
// ANALYZE.
func readBacklog(ctx context.Context, tx pgx.Tx, queues []string) ([]queueDepth, int64, error) {
	if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
		return nil, 0, fmt.Errorf("worker: queue depth: %w", err)
	}
	rows, err := tx.Query(ctx, sqlQueueDepth, queues)
	if err != nil {
		return nil, 0, fmt.Errorf("worker: queue depth: %w", err)
	}
	depths, err := pgx.CollectRows(rows, pgx.RowToStructByName[queueDepth])
	if err != nil {
		return nil, 0, fmt.Errorf("worker: queue depth: %w", err)
	}
	var total int64
	if err := tx.QueryRow(ctx, sqlShardUnfinished).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("worker: unfinished runs: %w", err)
	}
	return depths, total, nil
}
