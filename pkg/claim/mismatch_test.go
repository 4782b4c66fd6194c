package claim_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/fairkeys"
)

// A queue switched from runtime back to claims still gets the worker time
// of the attempts its runtime claims billed, when they end after the
// switch (fair_held). Every fair claim settles that time before it picks,
// and so must a fair batch of a queue with one key with work: the lone
// step folds nothing, so such a batch goes the exclusive way while held
// time waits. Before, it claimed from the unsettled pass: the key's next
// lag was the 1 s estimate billed, not the few milliseconds its attempt
// held (the replays weight.fail and twolevel.fail of the property tests).
func TestFairBatchSettlesHeldTimeAfterRuntimeSwitchedOff(t *testing.T) {
	t.Parallel()
	for _, twoLevel := range []bool{false, true} {
		t.Run(fmt.Sprintf("two level %v", twoLevel), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			m := fairkeys.NewModel()
			now := time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC)
			setModes := func(two bool, c fairkeys.Charge) {
				b.exec(`SELECT harvest_queue_fairness_set('q', $1, $2, 'test')`, two, string(c))
				m.SetTwoLevel("q", two)
				m.SetCharge("q", c)
			}
			setModes(twoLevel, fairkeys.ChargeRuntime)
			run := b.run(runOpts{})
			for range 3 {
				task := fairkeys.Task{Queue: "q", Key: "a/1", DueAt: now.Add(-time.Second)}
				task.ID = b.task(taskOpts{RunPK: run, Queue: "q", Key: task.Key, DueAt: task.DueAt, Now: now})
				m.Insert(task)
			}
			req := fairkeys.ClaimRequest{Queue: "q", Worker: "w", Now: now, Fair: true}
			first := b.claim(sqlRequest(req))
			want := m.Claim(req)
			require.True(t, first.OK && want.OK)
			require.Equal(t, want.Task.ID, first.Task.ID)

			// Per claim from here on; the attempt billed by runtime ends
			// after the switch and leaves its held time to settle.
			setModes(false, fairkeys.ChargeClaims)
			require.NoError(t, claim.Complete(b.ctx, b.db, first.Task.ID, first.Task.LeaseToken, nil))
			held := b.held("q")
			require.Len(t, held, 1)
			require.Less(t, held[0].Secs, 1.0, "held less than the estimate billed")
			m.CompleteHeld(first.Task.ID, held[0].Secs)

			got, err := claim.ClaimBatch(b.ctx, b.db, sqlRequest(req), 2)
			require.NoError(t, err)
			require.Len(t, got, 2)
			for i := range got {
				w := m.Claim(req)
				require.True(t, w.OK && got[i].OK)
				require.Equal(t, w.Task.ID, got[i].Task.ID, "claim %d", i+1)
				require.Equal(t, w.Lag, got[i].Lag, "claim %d: the lag of the settled pass", i+1)
			}
			require.Empty(t, b.held("q"), "the batch settled the held time")

			var pass, last float64
			require.NoError(t, b.db.QueryRow(b.ctx,
				`SELECT pass, last_start FROM fair_state WHERE queue = 'q' AND key = 'a/1'`).Scan(&pass, &last))
			s, ok := m.State("q", "a/1")
			require.True(t, ok)
			require.Equal(t, s.Pass, pass)
			require.Equal(t, s.LastStart, last)
		})
	}
}
