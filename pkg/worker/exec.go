package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/harvest-run/harvest/internal/telemetry"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/claim"
)

// claimed is a task this worker holds the lease of, with what the claim
// returned of its run.
type claimed struct {
	task    Task
	token   [16]byte
	status  api.Status
	timeout time.Duration
	parent  trace.SpanContext // the run's start span, when its context was stored
	links   []trace.Link      // the claim span
	free    func()            // batch mode: gives the task's slot back (idempotent)
}

// claim takes one task: the named row when id > 0 (a dispatch), otherwise
// the best task of the worker's queues, one queue at a time in a random
// order weighted by the queue weights (lags of two queues do not compare).
// It never claims once ctx has ended, and a claim under way is not cut
// short by ctx, so a stop signal cannot strand a leased row (run gives
// back what such a claim took).
func (w *Worker) claim(ctx context.Context, rng *rand.Rand, id int64, queue string) (*claimed, bool) {
	if ctx.Err() != nil {
		return nil, false
	}
	if w.hooks.Claiming != nil {
		w.hooks.Claiming()
	}
	dbctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
	defer cancel()
	queues := []string{queue}
	if id == 0 {
		queues = claim.QueueOrder(w.queues, rng)
	}
	for _, q := range queues {
		c, ok, err := w.claimOne(dbctx, q, id)
		if err != nil {
			w.log.Warn("claim failed", "queue", q, "err", err)
			return nil, false
		}
		if ok {
			return c, true
		}
	}
	return nil, false
}

// claimOne is one claim statement on one queue, with its span and metrics.
func (w *Worker) claimOne(ctx context.Context, queue string, id int64) (*claimed, bool, error) {
	// The claim statement runs outside any span: an idle loop polls every
	// second, and a span per empty poll would bury the traces that matter.
	// Its span is made once the outcome is known, backdated to the start:
	// for a claimed task it joins the trace of the run's start (its
	// context is stored on the task), otherwise it is a trace of its own,
	// made only when the claim failed.
	req := claim.Request{Queue: queue, Worker: w.cfg.ID, Fair: w.cfg.FairnessKeys,
		AgingSecs: w.cfg.PriorityAgingSecs, Lease: w.cfg.Lease}
	start := time.Now()
	var (
		res claim.Result
		err error
	)
	if id > 0 {
		res, err = claim.ClaimByID(ctx, w.db, id, req)
	} else {
		res, err = w.claimer.Claim(ctx, req)
	}
	outcome := res.Empty
	switch {
	case err != nil:
		outcome = "error"
	case res.OK:
		outcome = "ok"
	}
	w.inst.claimLatency.Record(ctx, time.Since(start).Seconds(), w.claimLabels(queue, ""))
	w.inst.claims.Add(ctx, 1, w.claimLabels(queue, outcome))
	// The span's attributes, built only for a span that records (with no
	// exporter a span only carries ids onward).
	attrs := func() []attribute.KeyValue {
		tried := len(res.Refused)
		if res.OK {
			tried++
		}
		return append(w.claimAttrs(queue, id > 0, outcome), attribute.Int("harvest.claim.rows_tried", tried))
	}
	if err != nil {
		_, span := w.inst.tracer.Start(ctx, "harvest.claim", trace.WithTimestamp(start))
		if span.IsRecording() {
			span.SetAttributes(attrs()...)
		}
		span.RecordError(err)
		span.SetStatus(codes.Error, "claim failed")
		span.End()
		return nil, false, err
	}
	if !res.OK {
		return nil, false, nil
	}
	ct := res.Task
	c := w.claimedTask(ct)
	if sc := telemetry.SpanContextFromJSON(ct.TraceContext); sc.IsValid() {
		c.parent = sc
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	ctx, span := w.inst.tracer.Start(ctx, "harvest.claim", trace.WithTimestamp(start))
	defer span.End()
	recording := span.IsRecording()
	if recording {
		span.SetAttributes(attrs()...)
		span.SetAttributes(takenAttrs(ct, res.Lag)...)
	}
	c.links = append(c.links, trace.Link{SpanContext: span.SpanContext()})
	if err := runKnown(ct); err != nil {
		span.RecordError(err)
		w.release(ctx, c)
		return nil, false, err
	}
	if recording {
		span.SetAttributes(runAttrs(c)...)
	}
	return c, true, nil
}

// claimAttrs are the attributes every harvest.claim span carries: where
// the claim ran and how it ended. Built only for a span that records
// (with no exporter a span only carries ids onward).
func (w *Worker) claimAttrs(queue string, dispatch bool, outcome string) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("harvest.queue", queue),
		attribute.Int("harvest.shard", w.cfg.Shard),
		attribute.Bool("harvest.fair", w.cfg.FairnessKeys),
		attribute.Bool("harvest.dispatch", dispatch),
		attribute.String("harvest.claim.outcome", outcome),
	}
}

// takenAttrs are a claim span's attributes for the task it took.
func takenAttrs(ct claim.Task, lag float64) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("harvest.fairness_key", ct.Key),
		attribute.Float64("harvest.claim.lag", lag),
		attribute.Int64("harvest.task_id", ct.ID),
		attribute.Int("harvest.attempt", ct.Attempt),
	}
}

// runAttrs name a claimed task's run on its claim span, once runKnown has
// checked the claim returned it.
func runAttrs(c *claimed) []attribute.KeyValue {
	return []attribute.KeyValue{attribute.String("harvest.run_id", c.task.RunID), attribute.String("harvest.tenant", c.task.Tenant)}
}

// claimedTask is a claimed task as the worker holds it: the task and its
// run, both as the claim statement returned them.
func (w *Worker) claimedTask(ct claim.Task) *claimed {
	return &claimed{token: ct.LeaseToken, status: api.Status(ct.RunStatus), timeout: ct.Timeout, task: Task{
		ID: ct.ID, RunID: ct.RunID, Tenant: ct.Tenant, Workflow: ct.Workflow, Queue: ct.Queue,
		Shard: w.cfg.Shard, Key: ct.Key, QuotaKey: ct.QuotaKey, Priority: ct.Priority, Step: ct.Step,
		Attempt: ct.Attempt, MaxAttempts: ct.MaxAttempts, Input: ct.Input,
	}}
}

// runKnown checks that the claim returned the task's run. A task's run row
// outlives it (tasks reference their run, deleted with it), so a claim
// without one is a fault of the schema: the task is handed back rather
// than run under an empty run id.
func runKnown(ct claim.Task) error {
	if ct.RunID == "" {
		return fmt.Errorf("claim of task %d: run %d not returned", ct.ID, ct.RunPK)
	}
	return nil
}

// run executes one claimed task and records its outcome.
func (w *Worker) run(c *claimed) {
	t := &c.task
	if w.hooks.Claimed != nil {
		w.hooks.Claimed(*t)
	}
	select {
	case <-w.stopping:
		// A claim under way when the stop began is not cut short, and it
		// may have taken a task this worker has just handed back (pending
		// again, same attempt): no handler starts once the worker stops,
		// so the task goes back unrun and no attempt runs twice here.
		ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
		defer cancel()
		outcome, err := w.release(ctx, c)
		w.finished(c, outcome, err)
		return
	default:
	}
	if c.status.Final() {
		// Cancelled before it ran: retire the task; the run stays as it is.
		outcome, err := w.retire(c)
		w.finished(c, outcome, err)
		return
	}
	h, ok := w.handlers[t.Workflow]
	if !ok {
		h = w.fallback
	}

	ctx, cancel := context.WithCancelCause(w.execCtx)
	defer cancel(nil)
	// A run started without a timeout gets the worker's default: nothing
	// else would end a handler that never returns, its heartbeats keeping
	// the lease and so the task slot for ever.
	if c.timeout <= 0 {
		c.timeout = w.cfg.DefaultTimeout
	}
	t.Deadline = time.Now().Add(c.timeout)
	ctx, cancelT := context.WithDeadlineCause(ctx, t.Deadline, ErrAttemptTimeout)
	defer cancelT()
	if c.parent.IsValid() {
		// The execution belongs to the trace of the run's start.
		ctx = trace.ContextWithRemoteSpanContext(ctx, c.parent)
	}
	ctx, span := w.inst.tracer.Start(ctx, "harvest.execute", trace.WithLinks(c.links...))
	defer span.End()
	// Attributes only for a span that records (see dispatch.Publish):
	// without an exporter, building them was a few per cent of a worker's
	// CPU in a flood of short tasks, for nothing.
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("harvest.workflow", t.Workflow),
			attribute.String("harvest.queue", t.Queue),
			attribute.Int("harvest.shard", t.Shard),
			attribute.String("harvest.fairness_key", t.Key),
			attribute.String("harvest.run_id", t.RunID),
			attribute.String("harvest.tenant", t.Tenant),
			attribute.Int64("harvest.task_id", t.ID),
			attribute.Int("harvest.step", t.Step),
			attribute.Int("harvest.attempt", t.Attempt),
		)
	}

	queueLabel := w.taskLabels(t.Queue, "")
	w.inst.running.Add(ctx, 1, queueLabel)
	// The worker's heartbeat loop extends the lease while the handler runs.
	w.beats.add(c, cancel)
	start := time.Now()
	res, herr, abandoned := w.callHandler(ctx, h, *t)
	w.inst.taskDuration.Record(ctx, time.Since(start).Seconds(), queueLabel)
	w.beats.remove(t.ID)
	w.inst.running.Add(ctx, -1, queueLabel)

	cause := context.Cause(ctx)
	if abandoned {
		cause = ErrShutdown
	}
	outcome, err := w.record(ctx, c, res, herr, cause)
	w.inst.tasks.Add(ctx, 1, w.taskLabels(t.Queue, string(outcome)))
	span.SetAttributes(attribute.String("harvest.outcome", string(outcome)))
	if herr != nil {
		span.RecordError(herr)
	}
	if err != nil || outcome == OutcomeFailed || outcome == OutcomeRetried {
		span.SetStatus(codes.Error, string(outcome))
	}
	w.finished(c, outcome, err)
}

func (w *Worker) finished(c *claimed, outcome Outcome, err error) {
	if err != nil {
		w.log.Warn("task outcome not recorded", "task", c.task.ID, "run", c.task.RunID, "outcome", outcome, "err", err)
	}
	if w.hooks.Finished != nil {
		w.hooks.Finished(c.task, outcome, err)
	}
}

// callHandler runs the handler, turning a panic into an error. The handler
// runs on a goroutine of its own so that a stopping worker can hand its
// task back even when the handler ignores its context (abandoned).
func (w *Worker) callHandler(ctx context.Context, h Handler, t Task) (res Result, err error, abandoned bool) {
	if h == nil {
		return Result{}, fmt.Errorf("worker %s has no handler for workflow %q", w.cfg.ID, t.Workflow), false
	}
	type out struct {
		res Result
		err error
	}
	ch := make(chan out, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				w.log.Error("handler panicked", "workflow", t.Workflow, "task", t.ID, "panic", r, "stack", string(debug.Stack()))
				ch <- out{err: fmt.Errorf("handler panicked: %v", r)}
			}
		}()
		r, e := h.Handle(ctx, t)
		ch <- out{r, e}
	}()
	select {
	case o := <-ch:
		return o.res, o.err, false
	case <-w.abandon:
		return Result{}, ErrShutdown, true
	}
}

// isStale reports the database's answer that a lease token is no longer
// the task's (or the task is gone). Every outcome goes through pkg/claim,
// whose mapError turns those codes into its sentinels.
func isStale(err error) bool {
	return errors.Is(err, claim.ErrStaleLease) || errors.Is(err, claim.ErrNotFound)
}

// record writes the attempt's outcome, fenced by the lease token, through
// the worker's outcome batches; the batch also publishes the run event
// when the run reached a final state.
func (w *Worker) record(ctx context.Context, c *claimed, res Result, herr, cause error) (Outcome, error) {
	dbctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
	defer cancel()
	t := c.task
	if herr == nil && res.Next == nil && len(res.Output) > 0 && !json.Valid(res.Output) {
		herr = Permanent(errors.New("handler output is not valid JSON"))
	}
	if herr == nil && res.Next != nil && len(res.Next.Input) > 0 && !json.Valid(res.Next.Input) {
		herr = Permanent(errors.New("handler's next input is not valid JSON"))
	}
	var (
		out     claim.Outcome
		outcome Outcome
	)
	switch {
	case errors.Is(cause, ErrLeaseLost):
		return OutcomeDiscarded, nil
	case errors.Is(cause, ErrRunCancelled):
		return w.retire(c)
	case herr == nil && res.Next != nil:
		// The sticky window and the delay count from the database clock.
		o := claim.ContinueOptions{Input: res.Next.Input, Delay: res.Next.Delay}
		if !res.Next.Anywhere {
			o.StickyFor = w.cfg.StickyFor
		}
		out, outcome = claim.Outcome{Kind: claim.OutcomeContinue, Continue: o}, OutcomeContinued
	case herr == nil:
		out, outcome = claim.Outcome{Kind: claim.OutcomeComplete, Output: res.Output}, OutcomeCompleted
	case errors.Is(cause, ErrShutdown):
		return w.release(dbctx, c)
	default:
		msg := herr.Error()
		if errors.Is(cause, ErrAttemptTimeout) {
			msg = fmt.Sprintf("attempt timed out after %s: %s", c.timeout, msg)
		}
		o := claim.FailOptions{Error: msg}
		if !IsPermanent(herr) {
			o.RetryAfter = w.backoff(t.Attempt)
		}
		out, outcome = claim.Outcome{Kind: claim.OutcomeFail, Fail: o}, OutcomeFailed
	}
	r, err := w.outcomes.record(dbctx, c, out)
	if isStale(err) {
		w.log.Info("lease lost before the outcome was recorded: result dropped", "task", t.ID, "run", t.RunID)
		return OutcomeDiscarded, nil
	}
	if err != nil {
		return OutcomeError, err
	}
	if r.Retried {
		outcome = OutcomeRetried
	}
	return outcome, nil
}

// retire marks the task of a cancelled run done without touching the run.
func (w *Worker) retire(c *claimed) (Outcome, error) {
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	// The run is final, so completing the task leaves the run (its status,
	// output and the tenant's count) as the cancel left it, and no run
	// event goes out.
	_, err := w.outcomes.record(ctx, c, claim.Outcome{Kind: claim.OutcomeComplete})
	if err != nil && !isStale(err) {
		return OutcomeError, err
	}
	return OutcomeDiscarded, nil
}

// release hands a claimed task back without counting the attempt.
func (w *Worker) release(ctx context.Context, c *claimed) (Outcome, error) {
	_, err := w.outcomes.record(ctx, c, claim.Outcome{Kind: claim.OutcomeRelease})
	if isStale(err) {
		return OutcomeDiscarded, nil
	}
	if err != nil {
		return OutcomeError, fmt.Errorf("hand back task %d: %w", c.task.ID, err)
	}
	return OutcomeReleased, nil
}

// backoff is the retry delay after a failed attempt: RetryBase doubled per
// attempt, at most RetryMax, then jittered down by up to half.
func (w *Worker) backoff(attempt int) time.Duration {
	d := w.cfg.RetryBase
	for i := 1; i < attempt && d < w.cfg.RetryMax; i++ {
		d *= 2
	}
	d = min(d, w.cfg.RetryMax)
	half := d / 2
	return d - half + time.Duration(rand.Int64N(int64(half)+1))
}
