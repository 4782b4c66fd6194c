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
// timer like the single-claim loop. While there is work it claims again as
// soon as a slot is free, except after a claim that came back full: then
// more tasks are surely waiting, and the loop holds out for a whole batch
// of free slots, for at most as long as that claim took (maxFillWait at
// most) and not past a wake-up. A claim statement costs about 2 ms of
// database time before its first row, so a loop that claimed whatever was
// free the moment the last claim returned alternated full and near-empty
// statements (in the flood, two claims in five took under five rows);
// waiting for a full batch halved the statements (docs/benchmarks.md,
// "Full claims"). A new key's task waits for the statement in flight and
// that pause at most (the fair order puts a key without debt first).

// batched runs the claim loops of batch mode and returns once they and
// every task they started have finished and been recorded.
func (w *Worker) batched(ctx context.Context) {
	slots := make(chan struct{}, w.cfg.MaxConcurrentClaims)
	// Tasks run on long-lived goroutines, not on one new goroutine each: a
	// fresh goroutine grows its stack again for every task, which cost the
	// worker a tenth of its CPU at fleet rates. There are two per slot: a
	// slot is freed when its outcome is queued, but its goroutine waits
	// for the outcome statement to commit, and with one per slot the next
	// batch's tasks waited for that commit before they could start.
	work := make(chan *claimed, w.cfg.MaxConcurrentClaims)
	var runners conc.WaitGroup
	for range runnersPerSlot * w.cfg.MaxConcurrentClaims {
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
	batch := min(w.cfg.ClaimBatch, w.cfg.MaxConcurrentClaims)
	var took time.Duration
	full := false
	for ctx.Err() == nil {
		woken := w.wake.wait()
		// Reserve one slot (waiting for it), then every other free one up
		// to the batch size.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		// After a full claim more tasks wait: hold out for a whole batch
		// of free slots, at most about as long as that claim took, and
		// not past a wake-up (new work may be another key's, which
		// should not wait for the flood's slots).
		var wait time.Duration
		if full {
			wait = min(took, maxFillWait)
		}
		want := reserveSlots(ctx, slots, batch, wait, woken)
		start := time.Now()
		cs := w.claimBatch(ctx, rng, want)
		took = time.Since(start)
		full = len(cs) == want
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

// runnersPerSlot is the number of task goroutines per slot in batch mode.
const runnersPerSlot = 2

// maxFillWait bounds the wait for a full batch of free slots after a claim
// that came back full.
const maxFillWait = 20 * time.Millisecond

// reserveSlots reserves free slots beside the one the caller holds, up to
// n in all, and returns how many it holds. With wait above zero it waits
// that long at most for the n, and no longer once cut is closed; otherwise
// it takes what is free at once.
func reserveSlots(ctx context.Context, slots chan<- struct{}, n int, wait time.Duration, cut <-chan struct{}) int {
	held := 1
free:
	for held < n {
		select {
		case slots <- struct{}{}:
			held++
		default:
			break free
		}
	}
	if held >= n || wait <= 0 {
		return held
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for held < n {
		select {
		case slots <- struct{}{}:
			held++
		case <-t.C:
			return held
		case <-cut:
			return held
		case <-ctx.Done():
			return held
		}
	}
	return held
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
	// A queue whose last batch came back short likely holds a row or two:
	// fair single claims take those for less than a bulk plan
	// (claim.Request's Shallow; ordinary batches ignore it, so it is not
	// sent with them). A full batch turns the hint off again.
	shallow := w.shallow[queue]
	req := claim.Request{Queue: queue, Worker: w.cfg.ID, Fair: w.cfg.FairnessKeys,
		AgingSecs: w.cfg.PriorityAgingSecs, Lease: w.cfg.Lease, Shallow: w.cfg.FairnessKeys && shallow.Load()}
	start := time.Now()
	// The statement serves many runs, so it cannot sit in any one run's
	// trace: it gets a span of the worker's own, which each task's claim
	// span (in its run's trace) links to, and its Postgres spans hang
	// below it.
	bctx, bspan := w.inst.tracer.Start(ctx, "harvest.claim_batch", trace.WithAttributes(
		attribute.String("harvest.queue", queue),
		attribute.Int("harvest.shard", w.cfg.Shard),
		attribute.Bool("harvest.fair", w.cfg.FairnessKeys),
		attribute.Int("harvest.claim.want", n),
		attribute.Bool("harvest.claim.shallow", req.Shallow)))
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
	shallow.Store(len(took) < n)
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
			trace.WithLinks(trace.Link{SpanContext: bspan.SpanContext()}))
		// A span per task taken: its attributes only when it records, as
		// the execute span's (see run).
		recording := span.IsRecording()
		if recording {
			span.SetAttributes(w.claimAttrs(queue, false, "ok")...)
			span.SetAttributes(attribute.Int("harvest.claim.batch", len(took)))
			span.SetAttributes(takenAttrs(ct, r.Lag)...)
		}
		c.links = append(c.links, trace.Link{SpanContext: span.SpanContext()})
		if err := runKnown(ct); err != nil {
			span.RecordError(err)
			span.End()
			w.log.Warn("batch claim: handing a task back", "task", ct.ID, "err", err)
			_, _ = w.release(ctx, c)
			continue
		}
		if recording {
			span.SetAttributes(runAttrs(c)...)
		}
		span.End()
		out = append(out, c)
	}
	return out, nil
}
