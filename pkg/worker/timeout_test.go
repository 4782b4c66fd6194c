package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/worker"
)

// A run started without a timeout is bounded by the worker's
// DefaultTimeout: its handler sees the deadline, its context ends with
// ErrAttemptTimeout, the attempt fails and the run's error says how long
// it had. Single claims and batch claims alike.
func TestDefaultTimeoutBoundsARunWithoutOne(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 4} {
		t.Run(fmt.Sprintf("claim batch %d", batch), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			deadline := make(chan time.Time, 1)
			cause := make(chan error, 1)
			r := b.worker(workerOpts{
				Config: func(c *worker.Config) {
					c.ClaimBatch = batch
					c.MaxConcurrentClaims = 2
					c.DefaultTimeout = 50 * time.Millisecond
				},
				Handlers: map[string]worker.HandlerFunc{
					"stuck": func(ctx context.Context, tk worker.Task) (worker.Result, error) {
						deadline <- tk.Deadline
						<-ctx.Done() // a handler that would wait for ever
						cause <- context.Cause(ctx)
						return worker.Result{}, ctx.Err()
					},
				},
			})
			st := b.start(startOpts{Name: "stuck", MaxAttempts: 1}) // no timeout of its own
			b.wake("q")
			require.Equal(t, worker.OutcomeFailed, r.next(t, b.ctx).Outcome)
			require.False(t, (<-deadline).IsZero(), "the handler sees the default's deadline")
			require.ErrorIs(t, <-cause, worker.ErrAttemptTimeout)
			require.Contains(t, *b.run("acme", st.Run.ID).Error, "attempt timed out after 50ms")
		})
	}
}

// A run's own timeout wins over the worker's default, longer or shorter.
func TestRunTimeoutWinsOverTheDefault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	got := make(chan time.Duration, 1)
	r := b.worker(workerOpts{
		Config: func(c *worker.Config) { c.DefaultTimeout = time.Millisecond },
		Handlers: map[string]worker.HandlerFunc{
			"quick": func(_ context.Context, tk worker.Task) (worker.Result, error) {
				got <- time.Until(tk.Deadline)
				return worker.Complete(nil), nil
			},
		},
	})
	b.start(startOpts{Name: "quick", Timeout: time.Hour})
	b.wake("q")
	require.Equal(t, worker.OutcomeCompleted, r.next(t, b.ctx).Outcome)
	require.Greater(t, <-got, time.Minute, "the run's hour, not the default's millisecond")
}

// The settings this change added are checked, naming the field.
func TestConfigValidateNamesTheNewFields(t *testing.T) {
	t.Parallel()
	d := worker.DefaultConfig()
	require.Equal(t, worker.DefaultTimeout, d.DefaultTimeout)
	require.Equal(t, worker.DefaultFairPruneInterval, d.Janitor.FairPruneInterval)
	require.Equal(t, worker.DefaultAuditRetention, d.Janitor.AuditRetention)
	require.Equal(t, worker.DefaultRecountInterval, d.Janitor.RecountInterval)
	cases := map[string]func(*worker.Config){
		"DefaultTimeout":            func(c *worker.Config) { c.DefaultTimeout = 0 },
		"Janitor.FairPruneInterval": func(c *worker.Config) { c.Janitor.FairPruneInterval = -time.Second },
		"Janitor.AuditRetention":    func(c *worker.Config) { c.Janitor.AuditRetention = -time.Hour },
		"Janitor.RecountInterval":   func(c *worker.Config) { c.Janitor.RecountInterval = -time.Second },
	}
	for field, mutate := range cases {
		c := worker.DefaultConfig()
		mutate(&c)
		var ce *worker.ConfigError
		require.ErrorAs(t, c.Validate(), &ce, field)
		require.Equal(t, field, ce.Field)
	}
	c := worker.DefaultConfig()
	c.Janitor.AuditRetention, c.Janitor.FairPruneInterval, c.Janitor.RecountInterval = 0, 0, 0
	require.NoError(t, c.Validate(), "0 keeps audit rows for ever, and prunes and recounts on every tick")
}
