package worker_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/dispatch"
	"github.com/harvest-run/harvest/pkg/worker"
)

// A wake-up sends one worker of the shard into a claim, not every worker:
// of three idle workers, the one that runs the task is the only one that
// claims (its loop claims once more after the task and finds nothing); the
// other two never claim. Before, every worker claimed on every wake-up
// and all but one found nothing.
func TestWakeUpGoesToOneWorker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var ws []*running
	for i := range 3 {
		nc, err := nats.Connect(b.nc.ConnectedUrl())
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		r := b.worker(workerOpts{NC: nc, Config: func(c *worker.Config) { c.ID = fmt.Sprint("w", i) }})
		r.waitIdle(t, b.ctx, 1)
		ws = append(ws, r)
	}
	b.start(startOpts{})
	b.wake("q")
	winner := -1
	select {
	case f := <-ws[0].Finished:
		require.Equal(t, worker.OutcomeCompleted, f.Outcome)
		winner = 0
	case f := <-ws[1].Finished:
		require.Equal(t, worker.OutcomeCompleted, f.Outcome)
		winner = 1
	case f := <-ws[2].Finished:
		require.Equal(t, worker.OutcomeCompleted, f.Outcome)
		winner = 2
	case <-b.ctx.Done():
		t.Fatal("no worker ran the task")
	}
	ws[winner].waitIdle(t, b.ctx, 1)
	for _, r := range ws {
		r.Stop(t)
	}
	for i, r := range ws {
		require.Zero(t, len(r.Idle), "worker %d claimed after the wake-up (winner %d)", i, winner)
	}
}

// A wake-up that reaches a worker none of whose loops is free is passed on
// to another worker of the shard, counted in a header, at most three
// times.
func TestBusyWorkerPassesWakeUpOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan struct{}, 1)
	r := b.worker(workerOpts{Handlers: map[string]worker.HandlerFunc{
		"echo": func(ctx context.Context, tk worker.Task) (worker.Result, error) {
			started <- struct{}{}
			<-ctx.Done() // until the worker stops
			return worker.Complete(tk.Input), nil
		},
	}})
	r.waitIdle(t, b.ctx, 1)
	b.start(startOpts{})
	b.wake("q")
	<-started // the worker's only loop is busy now

	seen, err := b.nc.SubscribeSync(dispatch.Subjects{}.Wake(0, "q"))
	require.NoError(t, err)
	require.NoError(t, b.nc.Flush())
	require.NoError(t, dispatch.Publish(b.ctx, b.nc, dispatch.Subjects{}.Wake(0, "q"), dispatch.Wake{Tasks: 2}))
	for hop := range 4 {
		msg, err := seen.NextMsg(time.Minute)
		require.NoError(t, err)
		got := msg.Header.Get("Harvest-Wake-Hops")
		if hop == 0 {
			require.Empty(t, got, "the wake-up as published")
			continue
		}
		require.Equal(t, strconv.Itoa(hop), got)
		require.JSONEq(t, `{"tasks":2}`, string(msg.Data), "passed on with the tasks it names")
	}
}
