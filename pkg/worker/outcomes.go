package worker

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/sourcegraph/conc"
	"go.opentelemetry.io/otel/trace"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/dispatch"
)

// outcomes records the outcomes of a worker's attempts in batches, in both
// claim modes: completions, continuations, failures (retried or final),
// releases and the retirement of a cancelled run's task all queue here,
// and one flusher writes whatever is waiting (at most CompleteBatch) with
// one claim.RecordOutcomes statement, each outcome fenced by its own lease
// token. Each caller is answered once the statement has committed, with
// its own result; then the run events of the runs the statement finished
// are published together, from what the statement returned (no read of
// their own).
//
// One commit per outcome was the cost that capped a mixed workload: a
// continuation or a retry waited for a WAL flush of its own while the
// completions around it shared one. Batched, every kind shares it.
type outcomes struct {
	w    *Worker
	in   chan *pendingOutcome
	max  int
	wg   conc.WaitGroup
	once sync.Once
}

// pendingOutcome is one outcome waiting for the flusher.
type pendingOutcome struct {
	out   claim.Outcome
	queue string            // the task's queue: where a continuation waits
	span  trace.SpanContext // the attempt's span: the run event's parent
	done  chan outcomeAnswer
}

type outcomeAnswer struct {
	res claim.OutcomeResult
	err error
}

// outcomeFlushers is the number of outcome statements in flight per
// worker. One: every final outcome of a tenant updates that tenant's row of
// unfinished runs, so statements of one tenant commit one after the other
// anyway; with a single flusher the outcomes that arrive while one
// statement commits all go into the next (fewer, larger commits).
const outcomeFlushers = 1

func newOutcomes(w *Worker) *outcomes {
	n := w.cfg.CompleteBatch
	if n < 1 {
		n = DefaultCompleteBatch
	}
	o := &outcomes{w: w, in: make(chan *pendingOutcome, n), max: n}
	for range outcomeFlushers {
		o.wg.Go(o.flush)
	}
	return o
}

// record queues the outcome of c's attempt and waits for its result: the
// statement's answer for it (Err wraps claim.ErrStaleLease or
// claim.ErrNotFound when it was not recorded), or the statement's error.
// Once queued, c no longer runs, so its batch slot is given back at once;
// the queue itself is bounded (CompleteBatch waiting, plus the batch being
// written), so the tasks a worker leased and has not recorded stay below
// MaxConcurrentClaims + 2*CompleteBatch.
func (o *outcomes) record(ctx context.Context, c *claimed, out claim.Outcome) (claim.OutcomeResult, error) {
	out.ID, out.Token = c.task.ID, c.token
	p := &pendingOutcome{out: out, queue: c.task.Queue, span: trace.SpanContextFromContext(ctx), done: make(chan outcomeAnswer, 1)}
	select {
	case o.in <- p:
	case <-ctx.Done():
		return claim.OutcomeResult{}, ctx.Err()
	}
	if c.free != nil {
		c.free()
	}
	select {
	case a := <-p.done:
		return a.res, a.err
	case <-ctx.Done():
		// The statement may still commit; the caller treats this like any
		// unrecorded outcome (the lease will expire if it did not).
		return claim.OutcomeResult{}, ctx.Err()
	}
}

// close stops the flusher once every outcome sent has been recorded. Call
// it after every claim loop and task has finished.
func (o *outcomes) close() {
	o.once.Do(func() { close(o.in) })
	o.wg.Wait()
}

func (o *outcomes) flush() {
	batch := make([]*pendingOutcome, 0, o.max)
	for first := range o.in {
		batch = append(batch[:0], first)
	gather:
		for len(batch) < o.max {
			select {
			case x, ok := <-o.in:
				if !ok {
					break gather
				}
				batch = append(batch, x)
			default:
				break gather
			}
		}
		o.write(batch)
	}
}

// finalRun is a run an outcome statement finished, for its event.
type finalRun struct {
	run  api.Run
	span trace.SpanContext
}

func (o *outcomes) write(batch []*pendingOutcome) {
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	outs := make([]claim.Outcome, len(batch))
	for i, p := range batch {
		outs[i] = p.out
	}
	res, err := claim.RecordOutcomes(ctx, o.w.db, time.Time{}, outs)
	var runs []finalRun
	// In batch mode, the queues where a continuation became due (see the
	// turns below).
	turns := o.w.cfg.ClaimBatch > 1
	var next []string
	for i, p := range batch {
		a := outcomeAnswer{err: err}
		if err == nil {
			a.res, a.err = res[i], res[i].Err
			if r := res[i].Run; r != nil {
				r.Shard = o.w.cfg.Shard
				runs = append(runs, finalRun{run: *r, span: p.span})
			}
			if turns && res[i].NextID > 0 && dueNow(p.out.Continue) && !slices.Contains(next, p.queue) {
				next = append(next, p.queue)
			}
		}
		p.done <- a
	}
	// A continuation due at once waits for this worker (it is pinned to
	// it unless its handler asked otherwise) and nothing announces it: no
	// gateway sent a wake-up for it. In batch mode the claim loop does not
	// run the task, so it had claimed again while the handler still ran,
	// found nothing and gone to wait: each step of a run waited for the
	// next poll (a second by default) when nothing else woke the loop. A
	// turn per queue serves every continuation of the statement (a batch
	// claim takes them all). A loop of one task each claims again itself
	// once its task's outcome is recorded, so single-claim mode needs none.
	for _, q := range next {
		o.w.claimTurn(q)
	}
	o.w.publishRuns(ctx, runs)
}

// dueNow reports whether a continuation's next task is due at once.
func dueNow(c claim.ContinueOptions) bool {
	return c.Delay <= 0 && c.DueAt.IsZero()
}

// publishRuns announces runs that reached a final state, all at once after
// the commit: the messages go into the connection's buffer and out in one
// write. The database is the truth; a lost message only delays whoever
// waits for it.
func (w *Worker) publishRuns(ctx context.Context, runs []finalRun) {
	if w.nc == nil {
		return
	}
	for _, fr := range runs {
		pctx := ctx
		if fr.span.IsValid() {
			// The event belongs to the trace of the attempt that ended
			// the run.
			pctx = trace.ContextWithSpanContext(ctx, fr.span)
		}
		if err := dispatch.Publish(pctx, w.nc, w.subj.Runs(fr.run.Tenant, fr.run.ID), fr.run); err != nil {
			w.log.Warn("run event not published", "run", fr.run.ID, "err", err)
		}
	}
}
