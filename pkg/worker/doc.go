// Package worker is the Harvest worker runtime: it claims the tasks of one
// shard and runs them with handlers registered per workflow name. The stock
// binary (cmd/worker) is built on it, and a Go service can embed it to run
// its own workflows in-process (after creating the shard's schema with
// migrate.Up of package pkg/migrate):
//
//	err := migrate.Up(ctx, pool)
//	w, err := worker.New(pool, cfg, worker.Options{NATS: nc})
//	w.HandleFunc("resize", func(ctx context.Context, t worker.Task) (worker.Result, error) {
//		out, err := resize(ctx, t.Input)
//		if err != nil {
//			return worker.Result{}, err // retried with backoff
//		}
//		return worker.Complete(out), nil
//	})
//	err = w.Run(ctx) // until ctx ends, then a graceful stop
//
// # Claiming
//
// By default a worker claims in batches (Config.ClaimBatch above 1): it
// keeps Config.MaxConcurrentClaims task slots and fills the free ones with
// one claim statement of up to ClaimBatch rows, taken in the order as many
// single claims would take them (see batch.go). With ClaimBatch 1 it runs
// MaxConcurrentClaims claim loops
// instead: each loop claims one task, runs it to the end and claims again;
// so n loops run at most n tasks at once, and at most n claims of one
// worker can be in flight together (the C of the fairness guarantees). Over several queues a loop tries one
// queue at a time, in a random order weighted by the queue weights; with
// Config.FairnessKeys each claim serves the keys of the queue in weighted
// round robin (pkg/claim).
//
// A loop that found nothing waits for whichever comes first: a wake-up on
// harvest.wake.<shard>.<queue>, a dispatch on harvest.dispatch.<shard>.<queue>
// (both queue-group subscriptions, so one worker gets each: it hands one
// idle loop a claim, and passes the wake-up on to another worker when none
// of its loops is idle or the wake-up names more tasks than that claim
// takes), or the poll timer (Config.PollInterval plus up to 20% jitter).
// NATS only shortens the wait;
// with NATS down the worker keeps working by polling. A dispatch names one
// row: the loop claims that row by id only when it is the queue's only due
// work, and otherwise claims as usual, so a dispatch never lets a key in
// debt pass a key without debt.
//
// # Running
//
// The handler's context ends when the lease is lost, the run is cancelled,
// the run's timeout (or the worker's DefaultTimeout) passes, or the stop's
// grace period is over; the cause
// (context.Cause) is one of ErrLeaseLost, ErrRunCancelled,
// ErrAttemptTimeout, ErrShutdown. While it runs, the worker's heartbeat
// loop extends its lease every Config.HeartbeatInterval, with one statement
// for all the tasks the worker runs (heartbeat.go); the heartbeat also
// reads each run's status, which is how a cancel reaches a running handler.
// Every outcome, in both claim modes, goes through the worker's outcome
// flusher (outcomes.go): whatever outcomes are waiting (completions,
// continuations, failures, hand-backs) are written with one statement,
// each with its own lease token, so a worker that lost its lease (it was
// paused past the lease and the task was rescued) cannot overwrite the
// attempt that replaced it. When a run reaches a final state the worker
// publishes the run resource on harvest.runs.<tenant>.<run_id> after the
// commit, from what the statement returned.
//
// # Stopping
//
// When Run's context ends the worker stops claiming, lets running handlers
// finish within Config.ShutdownGrace, then cancels them and hands their
// tasks back as pending without counting the attempt. A claim under way
// when the stop begins still finishes, and its tasks are handed back too,
// their handlers never started. Nothing it claimed is left running.
package worker
