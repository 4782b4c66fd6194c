package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// backlogTimeout bounds the two counting statements made at each
// collection of the backlog gauges.
const backlogTimeout = 2 * time.Second

// BacklogMetrics registers two gauges read from the shard at each metrics
// collection (each scrape of /metrics):
//
//   - harvest.queue.depth{shard, queue, state}: tasks of each of queues
//     that are waiting (state "pending": due, or "scheduled": due later)
//     or held by a worker ("running").
//   - harvest.runs.unfinished{shard}: the shard's unfinished runs, the sum
//     of its tenants' running counts (what admission counts).
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
		counts := map[[2]string]int64{}
		for _, q := range qs {
			for _, st := range []string{"pending", "scheduled", "running"} {
				counts[[2]string{q, st}] = 0
			}
		}
		rows, err := db.Query(ctx, `SELECT queue, state, count(*) FROM tasks
			WHERE queue = ANY($1) AND state <> 'done' GROUP BY queue, state`, qs)
		if err != nil {
			return fmt.Errorf("worker: queue depth: %w", err)
		}
		for rows.Next() {
			var q, st string
			var n int64
			if err := rows.Scan(&q, &st, &n); err != nil {
				rows.Close()
				return fmt.Errorf("worker: queue depth: %w", err)
			}
			counts[[2]string{q, st}] = n
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("worker: queue depth: %w", err)
		}
		for k, n := range counts {
			o.ObserveInt64(depth, n, metric.WithAttributes(shardAttr,
				attribute.String("queue", k[0]), attribute.String("state", k[1])))
		}
		var total int64
		if err := db.QueryRow(ctx, `SELECT coalesce(sum(running), 0) FROM tenant_running`).Scan(&total); err != nil {
			return fmt.Errorf("worker: unfinished runs: %w", err)
		}
		o.ObserveInt64(unfinished, total, metric.WithAttributes(shardAttr))
		return nil
	}, depth, unfinished)
	if err != nil {
		return nil, fmt.Errorf("worker: metrics: %w", err)
	}
	return reg.Unregister, nil
}
