package claim_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/pkg/claim"
)

// The outcome benchmarks write the outcomes of a worker's mix (of 32:
// 16 completions, 8 continuations, 4 retries, 4 final failures) one
// statement per outcome (each its own commit, as continuations and
// failures were written before they were batched) and as one batch; the
// heartbeat benchmarks extend 50 leases one statement each and with one
// statement. ns/outcome and ns/lease are the figures to compare; the
// machine's load moves them, their ratio less.

const benchMix = 32

// leaseFresh inserts n running tasks of new runs (counted), leased to "w"
// for an hour, and returns their leases.
func (b *bundle) leaseFresh(n int) []claim.Lease {
	b.t.Helper()
	rows, err := b.db.Query(b.ctx, `
		WITH r AS (
		    INSERT INTO runs (tenant, id, name, queue, request_hash, status, attempts, max_attempts)
		    SELECT 'bench', gen_random_uuid()::text, 'wf', 'q', '\x00', 'running', 1, 3 FROM generate_series(1, $1)
		    RETURNING pk
		), c AS (
		    INSERT INTO tenant_running (tenant, running) VALUES ('bench', $1)
		    ON CONFLICT (tenant) DO UPDATE SET running = tenant_running.running + $1
		)
		INSERT INTO tasks (run_pk, queue, state, attempt, lease_token, lease_expires_at, claimed_by, claimed_at)
		SELECT pk, 'q', 'running', 1, gen_random_uuid(), now() + interval '1 hour', 'w', now() FROM r
		RETURNING id, lease_token`, n)
	if err != nil {
		b.t.Fatal(err)
	}
	ls, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claim.Lease, error) {
		var l claim.Lease
		return l, r.Scan(&l.ID, &l.Token)
	})
	if err != nil {
		b.t.Fatal(err)
	}
	return ls
}

// mixOutcome is outcome i of the benchmark mix for lease l.
func mixOutcome(i int, l claim.Lease) claim.Outcome {
	o := claim.Outcome{ID: l.ID, Token: l.Token}
	switch {
	case i%2 == 0:
		o.Kind, o.Output = claim.OutcomeComplete, json.RawMessage(`{"ok":true}`)
	case i%4 == 1:
		o.Kind, o.Continue = claim.OutcomeContinue, claim.ContinueOptions{Input: json.RawMessage(`{}`), StickyFor: 10 * time.Second}
	case i%8 == 3:
		o.Kind, o.Fail = claim.OutcomeFail, claim.FailOptions{Error: "again", RetryAfter: time.Second}
	default:
		o.Kind, o.Fail = claim.OutcomeFail, claim.FailOptions{Error: "bad input"}
	}
	return o
}

func BenchmarkOutcomesOneStatementEach(b *testing.B) {
	tb := setup(b)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		ls := tb.leaseFresh(benchMix)
		b.StartTimer()
		for j, l := range ls {
			o := mixOutcome(j, l)
			var err error
			switch o.Kind {
			case claim.OutcomeComplete:
				err = claim.Complete(tb.ctx, tb.db, l.ID, l.Token, o.Output)
			case claim.OutcomeContinue:
				_, err = claim.Continue(tb.ctx, tb.db, l.ID, l.Token, o.Continue)
			case claim.OutcomeFail:
				_, err = claim.Fail(tb.ctx, tb.db, l.ID, l.Token, o.Fail)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchMix), "ns/outcome")
}

func BenchmarkOutcomesOneBatch(b *testing.B) { benchOneBatch(b, benchMix, mixOutcome, false) }

// BenchmarkOutcomesFloodBatch records batches of the flood's shape:
// completions of one-step runs, one statement. 48 is about what the
// worker's outcome batch holds at fleet rates; 256 is the most it takes
// (the shipped HARVEST_WORKER_COMPLETE_BATCH), which a flusher that fell
// behind sends: ns/outcome should not grow with the batch.
func BenchmarkOutcomesFloodBatch(b *testing.B) {
	complete := func(_ int, l claim.Lease) claim.Outcome {
		return claim.Outcome{ID: l.ID, Token: l.Token, Kind: claim.OutcomeComplete, Output: json.RawMessage(`{"ok":true}`)}
	}
	for _, n := range []int{48, 256} {
		b.Run(fmt.Sprint(n), func(b *testing.B) { benchOneBatch(b, n, complete, true) })
	}
}

// benchOneBatch records the outcomes outcome(i, lease) of n fresh leases
// in one statement per iteration; with final set, each must have made its
// run final.
func benchOneBatch(b *testing.B, n int, outcome func(int, claim.Lease) claim.Outcome, final bool) {
	tb := setup(b)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		ls := tb.leaseFresh(n)
		outs := make([]claim.Outcome, len(ls))
		for j, l := range ls {
			outs[j] = outcome(j, l)
		}
		b.StartTimer()
		res, err := claim.RecordOutcomes(tb.ctx, tb.db, time.Time{}, outs)
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range res {
			if r.Err != nil || (final && r.Run == nil) {
				b.Fatalf("outcome %+v: not recorded as asked", r)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/outcome")
}

const benchLeases = 50

func BenchmarkHeartbeatOneStatementEach(b *testing.B) {
	tb := setup(b)
	ls := tb.leaseFresh(benchLeases)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, l := range ls {
			if _, err := claim.Heartbeat(tb.ctx, tb.db, l.ID, l.Token, time.Hour); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchLeases), "ns/lease")
}

func BenchmarkHeartbeatOneStatement(b *testing.B) {
	tb := setup(b)
	ls := tb.leaseFresh(benchLeases)
	ls = append(ls, claim.Lease{ID: 1 << 40, Token: uuid.New()}) // an unknown one costs its probe too
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := claim.Heartbeats(tb.ctx, tb.db, ls, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchLeases), "ns/lease")
}
