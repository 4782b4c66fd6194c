package faults

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/tools/internal/soak"
)

// A worker SIGKILLed while it holds tasks: another worker's janitor puts
// them back once the lease is over (database clock), they run again, and
// nothing is lost or finished twice.
func TestWorkerKilledMidTask(t *testing.T) {
	e := setup(t, soak.LoadOptions{Probe: true})
	e.moreAcked(30)
	// A kill proves something only when the worker died still holding a
	// task: one whose completion was already on its way to Postgres
	// finishes anyway (the commit can land after the kill), and one of a
	// run cancelled meanwhile ends without running again. So after each
	// kill the test waits until each of the dead worker's tasks is done or
	// claimed again, and counts as orphaned, and rescued, those that were
	// claimed again; it kills again (the replacement) until one was.
	victim := e.f.Workers(0)[0]
	orphaned := map[int64]int{} // task -> the attempt the dead worker held
	for try := 1; try <= 8 && len(orphaned) == 0; try++ {
		held, replacement, err := e.f.KillWorkerMidTask(e.ctx, victim)
		require.NoError(t, err)
		// A task of the trickle's quota may wait a minute and more for its
		// next claim: it is not waited for.
		for task := range held {
			var quota string
			require.NoError(t, e.f.Direct(0).QueryRow(e.ctx, `SELECT quota_key FROM tasks WHERE id = $1`, task).Scan(&quota))
			if quota == soak.TrickleQuota {
				delete(held, task)
			}
		}
		require.Eventually(t, func() bool {
			for task, attempt := range held {
				a, state, _, err := e.f.TaskAttempt(e.ctx, 0, task)
				if err != nil || (state != "done" && a == attempt) {
					return false // still under the dead worker, or put back and not claimed yet
				}
			}
			return true
		}, time.Minute, 20*time.Millisecond, "the dead worker's tasks were neither finished nor claimed again")
		for task, attempt := range held {
			a, _, _, err := e.f.TaskAttempt(e.ctx, 0, task)
			require.NoError(t, err)
			if a > attempt {
				orphaned[task] = attempt
			}
		}
		t.Logf("kill %d: %s held %v, %d of them claimed again; replacement %s", try, victim, held, len(orphaned), replacement)
		victim = replacement
		e.moreAcked(10)
	}
	require.NotEmpty(t, orphaned, "no kill left a task behind")
	e.moreAcked(20)
	e.finish()
	// Once drained: every task the dead worker left behind ended, after a
	// later attempt.
	for task, attempt := range orphaned {
		a, state, _, err := e.f.TaskAttempt(e.ctx, 0, task)
		require.NoError(t, err)
		require.Equal(t, "done", state, "task %d", task)
		require.Greater(t, a, attempt, "task %d ran again", task)
	}
}

// A worker SIGSTOPped past its lease, then resumed: its tasks are claimed
// again by another worker meanwhile, and whatever the resumed worker then
// tries to complete is refused by the lease fence (the check compares each
// completed run's output, which names the attempt that made it, with the
// attempt that held the lease last).
func TestWorkerPausedPastLease(t *testing.T) {
	e := setup(t, soak.LoadOptions{Probe: true})
	e.moreAcked(30)
	victim := e.f.Workers(1)[0]
	// A pause proves something only when another worker claimed one of
	// the paused worker's tasks again; a task whose completion was already
	// on its way to Postgres when the worker stopped finishes anyway. Pause
	// again until one was claimed again.
	reclaimed := 0
	for try := 1; try <= 5 && reclaimed == 0; try++ {
		held, n, err := e.f.PauseWorkerPastLease(e.ctx, victim)
		require.NoError(t, err)
		t.Logf("pause %d: %s held %v, %d claimed again by another worker; resumed", try, victim, held, n)
		reclaimed = n
		e.moreAcked(10)
	}
	require.Positive(t, reclaimed, "no task of the paused worker was claimed again")
	e.moreAcked(30)
	require.False(t, e.f.Worker(victim).Exited(), "the resumed worker keeps running")
	rep := e.finish()
	require.Positive(t, rep.FencedChecked)
}

// The NATS server restarted under load: HTTP starts keep being
// acknowledged and runs keep finishing while it is down (workers poll),
// and afterwards NATS starts work again, workers reconnect and their run
// events are heard again.
func TestNATSRestartedUnderLoad(t *testing.T) {
	e := setup(t, soak.LoadOptions{})
	e.moreAcked(30)
	before := e.completed()
	e.f.StopNATS()
	httpBefore := e.ackedVia("http")
	require.NoError(t, waitCond(e, func() (bool, error) {
		return e.ackedVia("http") >= httpBefore+15 && e.completed() >= before+15, nil
	}), "HTTP starts and claims go on without NATS")
	require.NoError(t, e.f.StartNATS())
	natsBefore, doneBefore := e.ackedVia("nats"), e.completed()
	require.NoError(t, waitCond(e, func() (bool, error) {
		return e.ackedVia("nats") >= natsBefore+10 && e.completed() >= doneBefore+10, nil
	}), "NATS starts and claims resume")
	require.NoError(t, waitCond(e, func() (bool, error) {
		for _, id := range e.f.Workers(-1) {
			if !strings.Contains(e.f.Worker(id).Log(), "NATS reconnected") {
				return false, nil
			}
		}
		return true, nil
	}), "every worker reconnects to NATS")
	rep := e.finish()
	require.Positive(t, rep.FinalEvents)
}

// A shard stopped and started: its proxy refuses connections and cuts the
// open ones, and every backend on its database is terminated, for 3s.
// Starts for its tenants are retried (503) with the same ids until it is
// back; workers reconnect.
func TestShardStoppedAndStarted(t *testing.T) {
	e := setup(t, soak.LoadOptions{Probe: true})
	e.moreAcked(30)
	n, err := e.f.ShardOutage(e.ctx, 0, 3*time.Second)
	require.NoError(t, err)
	t.Logf("shard 0 down 3s; %d backends terminated", n)
	require.Positive(t, n)
	e.moreAcked(40)
	e.finish()
}

// A claimer's backend terminated in the middle of its claim transaction:
// the transaction rolls back (no lease, no charge, no count), the worker
// gets a fresh connection and claims again.
func TestClaimerTerminatedMidTransaction(t *testing.T) {
	e := setup(t, soak.LoadOptions{Probe: true})
	e.moreAcked(20)
	n, err := e.f.TerminateClaimer(e.ctx, 1)
	require.NoError(t, err)
	t.Logf("terminated %d claim backend(s) on shard 1", n)
	e.moreAcked(40)
	e.finish()
}

// A gateway SIGKILLed with starts in flight: the clients send the same
// starts again (same ids) to the other gateway or over NATS; a start the
// dead gateway had committed is answered as a replay (200), never as a
// second run or a conflict.
func TestGatewayKilledWithStartsInFlight(t *testing.T) {
	e := setup(t, soak.LoadOptions{Rate: 60, Probe: true})
	e.moreAcked(40)
	e.f.KillGateway(0)
	e.moreAcked(40)
	require.NoError(t, e.f.StartGateway(e.ctx, 0))
	e.moreAcked(30)
	rep := e.finish()
	t.Logf("%d retries, %d replays", rep.Retries, rep.Replays)
}

// A weight written while one shard is unreachable answers 207 naming that
// shard; sent again once it is back, it converges (200) and every shard
// reports the same override.
func TestWeightWritesWithShardUnreachable(t *testing.T) {
	e := setup(t, soak.LoadOptions{})
	e.moreAcked(20)
	what, err := e.f.WeightsDuringOutage(e.ctx, 1, "k1", 2.5)
	require.NoError(t, err)
	t.Log(what)
	e.moreAcked(20)
	e.finish()
}

// A proxy in front of a shard delays every connection and chunk and cuts
// every connection three times: gateways and workers see slow queries and
// broken connections and carry on.
func TestFlakyPostgresConnections(t *testing.T) {
	e := setup(t, soak.LoadOptions{Probe: true})
	e.moreAcked(20)
	cut := e.f.FlakyShard(0, 20*time.Millisecond, 3, time.Second)
	t.Logf("cut %d connections to shard 0", cut)
	require.Positive(t, cut)
	e.moreAcked(30)
	e.finish()
}

func waitCond(e *env, cond func() (bool, error)) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return errTimeout
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type timeoutError struct{}

func (timeoutError) Error() string { return "condition not met within 60s" }

var errTimeout error = timeoutError{}

// completed counts completed runs over all shards.
func (e *env) completed() int {
	total := 0
	for s := range e.f.Shards() {
		var n int
		if err := e.f.Direct(s).QueryRow(e.ctx, `SELECT count(*) FROM runs WHERE status = 'completed'`).Scan(&n); err == nil {
			total += n
		}
	}
	return total
}

// ackedVia counts the starts acknowledged over one transport.
func (e *env) ackedVia(via string) int {
	n := 0
	for _, a := range e.load.Acked() {
		if a.Via == via {
			n++
		}
	}
	return n
}
