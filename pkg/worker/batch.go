package worker

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sourcegraph/conc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/harvest-run/harvest/internal/telemetry"
	"github.com/harvest-run/harvest/pkg/claim"
)

// Batch mode (Config.ClaimBatch > 1).
//
// One claim statement per task commits once per task, and a commit costs
// about as much as the claim itself; on a small machine that caps a worker
// fleet near the database's commit rate. In batch mode a worker instead:
//
//   - keeps MaxConcurrentClaims task slots; BatchClaimers loops each reserve
//     the free slots (at most ClaimBatch) and fill them with one
//     claim.ClaimBatch statement, which takes the rows in the order single
//     claims would (a fair batch charges each key in the fair order) and
//     returns, with each row, what the worker needs of its run;
//   - runs every task on a goroutine of its own, exactly as the single-claim
//     loop does (handler, heartbeat, timeout, shutdown);
//   - records every outcome through the worker's outcome batches
//     (outcomes.go), as the single-claim loops do.
//
// A task holds its slot while its handler runs and until its outcome is
// queued for the outcome flusher, the way River counts its workers. The
// flusher's queue is bounded too, so the tasks a worker has leased and not
// yet recorded stay below MaxConcurrentClaims + 2*CompleteBatch. A
// claim loop that finds nothing waits for a wake-up, a dispatch or the poll
// timer like the single-claim loop; while there is work it claims again as
// soon as a slot is free, so a new key's task waits at most for the claim
// statement in flight (the fair order puts a key without debt first).

// batched runs the claim loops of batch mode and returns once they and
// every task they started have finished and been recorded.
func (w *Worker) batched(ctx context.Context) {
	slots := make(chan struct{}, w.cfg.MaxConcurrentClaims)
	// Tasks run on long-lived goroutines, one per slot, not on one new
	// goroutine each: a fresh goroutine grows its stack again for every
	// task, which cost the worker a tenth of its CPU at fleet rates. The
	// queue has room for a batch per slot goroutine: a slot is freed when
	// its completion is queued, a moment before its goroutine is free.
	work := make(chan *claimed, w.cfg.MaxConcurrentClaims)
	var runners conc.WaitGroup
	for range w.cfg.MaxConcurrentClaims {
		runners.Go(func() {
			for c := range work {
				w.runSlot(c)
			}
		})
	}
	var loops conc.WaitGroup
	for i := range w.cfg.BatchClaimers {
		loops.Go(func() { w.batchLoop(ctx, i, slots, work) })
	}
	loops.Wait()
	close(work)
	runners.Wait()
}

// runSlot runs one claimed task of batch mode and gives its slot back
// (once: queueing its outcome may have freed it already).
func (w *Worker) runSlot(c *claimed) {
	defer c.free()
	w.run(c)
}

// batchLoop is one claim loop of batch mode.
func (w *Worker) batchLoop(ctx context.Context, n int, slots chan struct{}, work chan<- *claimed) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), uint64(n)))
	timer := time.NewTimer(0)
	defer timer.Stop()
	for ctx.Err() == nil {
		woken := w.wake.wait()
		// Reserve one slot (waiting for it), then every other free one up
		// to the batch size.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		want := 1
	reserve:
		for want < w.cfg.ClaimBatch {
			select {
			case slots <- struct{}{}:
				want++
			default:
				break reserve
			}
		}
		cs := w.claimBatch(ctx, rng, want)
		for range want - len(cs) {
			<-slots
		}
		for _, c := range cs {
			// The slot is given back as soon as the task's outcome is
			// queued for the flusher (or when run returns): a slot is a
			// task being run, as in River.
			var once sync.Once
			c.free = func() { once.Do(func() { <-slots }) }
			work <- c
		}
		if len(cs) > 0 {
			continue
		}
		if w.hooks.Idle != nil {
			w.hooks.Idle()
		}
		d := w.cfg.PollInterval
		d += time.Duration(rng.Int64N(int64(d)/5 + 1))
		timer.Reset(d)
		select {
		case <-ctx.Done():
		case <-woken:
		case <-timer.C:
		case <-w.dispatches:
			// A dispatch names a task that became due; claiming a batch
			// in the fair order serves it (or something that comes first).
		}
		timer.Stop()
	}
}

// claimBatch takes up to n tasks: one batch statement per queue, queues in
// the weighted random order, until one of them gives tasks.
func (w *Worker) claimBatch(ctx context.Context, rng *rand.Rand, n int) []*claimed {
	if ctx.Err() != nil {
		return nil
	}
	if w.hooks.Claiming != nil {
		w.hooks.Claiming()
	}
	dbctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
	defer cancel()
	for _, q := range claim.QueueOrder(w.queues, rng) {
		cs, err := w.claimBatchOne(dbctx, q, n)
		if err != nil {
			w.log.Warn("batch claim failed", "queue", q, "err", err)
			return nil
		}
		if len(cs) > 0 {
			return cs
		}
	}
	return nil
}

func (w *Worker) claimBatchOne(ctx context.Context, queue string, n int) ([]*claimed, error) {
	req := claim.Request{Queue: queue, Worker: w.cfg.ID, Fair: w.cfg.FairnessKeys,
		AgingSecs: w.cfg.PriorityAgingSecs, Lease: w.cfg.Lease}
	start := time.Now()
	// The statement serves many runs, so it cannot sit in any one run's
	// trace: it gets a span of the worker's own, which each task's claim
	// span (in its run's trace) links to, and its Postgres spans hang
	// below it.
	bctx, bspan := w.inst.tracer.Start(ctx, "harvest.claim_batch", trace.WithAttributes(
		attribute.String("harvest.queue", queue),
		attribute.Int("harvest.shard", w.cfg.Shard),
		attribute.Bool("harvest.fair", w.cfg.FairnessKeys),
		attribute.Int("harvest.claim.want", n)))
	rs, err := claim.ClaimBatch(bctx, w.db, req, n)
	bspan.SetAttributes(attribute.Int("harvest.claim.batch", len(rs)))
	if err != nil {
		bspan.RecordError(err)
		bspan.SetStatus(codes.Error, "claim batch")
	}
	bspan.End()
	w.inst.claimLatency.Record(ctx, time.Since(start).Seconds(), w.claimLabels(queue, ""))
	if err != nil {
		w.inst.claims.Add(ctx, 1, w.claimLabels(queue, "error"))
		return nil, err
	}
	var took []claim.Result
	for _, r := range rs {
		if r.OK {
			took = append(took, r)
		}
	}
	if len(took) == 0 {
		outcome := claim.EmptyNoTask
		if len(rs) > 0 {
			outcome = rs[len(rs)-1].Empty
		}
		w.inst.claims.Add(ctx, 1, w.claimLabels(queue, outcome))
		return nil, nil
	}
	w.inst.claims.Add(ctx, int64(len(took)), w.claimLabels(queue, "ok"))

	out := make([]*claimed, 0, len(took))
	for _, r := range took {
		ct := r.Task
		c := w.claimedTask(ct)
		sctx := ctx
		if sc := telemetry.SpanContextFromJSON(ct.TraceContext); sc.IsValid() {
			c.parent = sc
			sctx = trace.ContextWithRemoteSpanContext(ctx, sc)
		}
		_, span := w.inst.tracer.Start(sctx, "harvest.claim", trace.WithTimestamp(start),
			trace.WithLinks(trace.Link{SpanContext: bspan.SpanContext()}), trace.WithAttributes(
				attribute.String("harvest.queue", queue),
				attribute.Int("harvest.shard", w.cfg.Shard),
				attribute.Bool("harvest.fair", w.cfg.FairnessKeys),
				attribute.Bool("harvest.dispatch", false),
				attribute.Int("harvest.claim.batch", len(took)),
				attribute.String("harvest.claim.outcome", "ok"),
				attribute.String("harvest.fairness_key", ct.Key),
				attribute.Float64("harvest.claim.lag", r.Lag),
				attribute.Int64("harvest.task_id", ct.ID),
				attribute.Int("harvest.attempt", ct.Attempt)))
		c.links = append(c.links, trace.Link{SpanContext: span.SpanContext()})
		if err := runKnown(ct); err != nil {
			span.RecordError(err)
			span.End()
			w.log.Warn("batch claim: handing a task back", "task", ct.ID, "err", err)
			_, _ = w.release(ctx, c)
			continue
		}
		span.SetAttributes(attribute.String("harvest.run_id", c.task.RunID), attribute.String("harvest.tenant", c.task.Tenant))
		span.End()
		out = append(out, c)
	}
	return out, nil
}
