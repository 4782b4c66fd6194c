package weights_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/dispatch"
	"github.com/harvest-run/harvest/pkg/weights"
)

// Two shards, the second one down: a write is a 207 that names it, a read
// lists it as unavailable; when the shard comes back it disagrees, and
// sending the write again converges.
func TestPartialWriteAndConvergence(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	a := testsvc.NewDB(t)
	dead := deadPool(t)
	down := shardsOf(a, dead)

	res, err := weights.Set(ctx, down, "ops", "shared", "tenant-42", 4)
	require.NoError(t, err)
	require.Equal(t, http.StatusMultiStatus, res.Status())
	require.Equal(t, []string{"ok", "unavailable"}, outcomes(res.Shards))
	require.Equal(t, 1, res.Shards[1].Shard)
	require.NotEmpty(t, res.Shards[1].Message)
	require.Contains(t, res.Message, "send the same request again")

	body, err := json.Marshal(res)
	require.NoError(t, err)
	var wire map[string]any
	require.NoError(t, json.Unmarshal(body, &wire))
	require.Equal(t, "shared", wire["queue"])
	require.Equal(t, "tenant-42", wire["key"])
	require.Equal(t, 4.0, wire["weight"])
	require.Equal(t, map[string]any{"shard": 0.0, "outcome": "ok", "message": ""}, wire["shards"].([]any)[0])

	read, err := weights.Get(ctx, down, "shared")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, read.Status())
	require.Equal(t, []int{1}, read.UnavailableShards)
	require.True(t, read.WeightsUniform, "the answering shards agree")
	require.Equal(t, []api.WeightOverride{{Key: "tenant-42", Weight: 4}}, stripMeta(read.Overrides))
	require.Len(t, read.Shards, 2)
	require.Equal(t, "unavailable", read.Shards[1].Outcome)

	// The shard "comes back": a real database that missed the write, and
	// that holds an override of its own that shard 0 lacks.
	b := testsvc.NewDB(t)
	_, err = weights.SetOne(ctx, b, "ops", "shared", "tenant-7", 2)
	require.NoError(t, err)
	back := shardsOf(a, b)

	read, err = weights.Get(ctx, back, "shared")
	require.NoError(t, err)
	require.False(t, read.WeightsUniform)
	require.Empty(t, read.UnavailableShards)
	require.Empty(t, read.Overrides, "no key is agreed on")
	require.Len(t, read.Shards, 2)
	require.Equal(t, []api.KeyWeight{{Key: "tenant-42", Weight: ptr(4.0)}, {Key: "tenant-7"}}, read.Shards[0].Differing)
	require.Equal(t, []api.KeyWeight{{Key: "tenant-42"}, {Key: "tenant-7", Weight: ptr(2.0)}}, read.Shards[1].Differing)
	body, err = json.Marshal(read)
	require.NoError(t, err)
	require.Contains(t, string(body), `"weights_uniform":false`)
	require.Contains(t, string(body), `"unavailable_shards":[]`)
	require.Contains(t, string(body), `{"key":"tenant-7","weight":null}`)

	// Send both writes again: every shard takes them, and they agree.
	res, err = weights.Set(ctx, back, "ops", "shared", "tenant-42", 4)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.Status(), res.Message)
	res, err = weights.Set(ctx, back, "ops", "shared", "tenant-7", 2)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.Status())
	read, err = weights.Get(ctx, back, "shared")
	require.NoError(t, err)
	require.True(t, read.WeightsUniform)
	require.Empty(t, read.Shards, "no detail when uniform and complete")
	require.Equal(t, []api.WeightOverride{{Key: "tenant-42", Weight: 4}, {Key: "tenant-7", Weight: 2}}, stripMeta(read.Overrides))
	body, err = json.Marshal(read)
	require.NoError(t, err)
	require.JSONEq(t, `{"queue":"shared","overrides":[{"key":"tenant-42","weight":4},{"key":"tenant-7","weight":2}],
		"weights_uniform":true,"unavailable_shards":[]}`, string(body))

	// A clear follows the same rules.
	cl, err := weights.Clear(ctx, down, "ops", "shared", "tenant-7")
	require.NoError(t, err)
	require.Equal(t, http.StatusMultiStatus, cl.Status())
	require.Nil(t, cl.Weight)
	cl, err = weights.Clear(ctx, back, "ops", "shared", "tenant-7")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, cl.Status())
	require.Equal(t, map[string]float64{"tenant-42": 4}, overrides(t, b, "shared"))

	// Every shard that was reached audited each write it got.
	require.Len(t, auditRows(t, a), 5)
	require.Len(t, auditRows(t, b), 4)
}

func stripMeta(in []api.WeightOverride) []api.WeightOverride {
	out := make([]api.WeightOverride, len(in))
	for i, o := range in {
		out[i] = api.WeightOverride{Key: o.Key, Weight: o.Weight}
	}
	return out
}

func TestNoShardTookIt(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	shards := shardsOf(deadPool(t), deadPool(t))
	res, err := weights.Set(ctx, shards, "ops", "q", "k", 2)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, res.Status())
	require.Equal(t, []string{"unavailable", "unavailable"}, outcomes(res.Shards))
	read, err := weights.Get(ctx, shards, "q")
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, read.Status())
	require.Equal(t, []int{0, 1}, read.UnavailableShards)
	keys, err := weights.Keys(ctx, shards, "q", 0)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, keys.Status())
}

// A shard at the cap makes the write a 409, even when another shard took
// it and a third is down.
func TestCapConflictWins(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	a, b := testsvc.NewDB(t), testsvc.NewDB(t)
	fill(t, b, "q", weights.MaxOverrides)
	shards := shardsOf(a, b, deadPool(t))
	res, err := weights.Set(ctx, shards, "ops", "q", "new-key", 2)
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, res.Status())
	require.Equal(t, []string{"ok", "cap_reached", "unavailable"}, outcomes(res.Shards))
	require.Contains(t, res.Message, "refused on shard 1")
	require.Contains(t, res.Message, "clear an override on that shard first")

	refusals := auditRows(t, b)
	require.Len(t, refusals, 1)
	require.Equal(t, "refused", refusals[0].Outcome)
	require.Equal(t, "ops", refusals[0].Actor)
	require.Equal(t, "new-key", refusals[0].Key)

	// Clear room on shard 1 and send again: 207 (shard 2 is still down).
	_, err = weights.ClearOne(ctx, b, "ops", "q", "k0001")
	require.NoError(t, err)
	res, err = weights.Set(ctx, shards, "ops", "q", "new-key", 2)
	require.NoError(t, err)
	require.Equal(t, http.StatusMultiStatus, res.Status())
	require.Equal(t, []string{"ok", "ok", "unavailable"}, outcomes(res.Shards))
}

func TestChangeEventPublished(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	nc, err := nats.Connect(testsvc.NATSURL(t))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	subj := dispatch.Subjects{}
	sub, err := nc.SubscribeSync(subj.Weights("orders.eu"))
	require.NoError(t, err)
	require.NoError(t, nc.Flush())

	db := testsvc.NewDB(t)
	res, err := weights.Set(ctx, shardsOf(db), "ops", "orders.eu", "k", 3, weights.WithNATS(nc, subj))
	require.NoError(t, err)
	require.NoError(t, res.PublishErr)
	msg, err := sub.NextMsg(5 * time.Second)
	require.NoError(t, err)
	require.Equal(t, "harvest.weights.orders%2Eeu", msg.Subject)
	var ev dispatch.WeightEvent
	require.NoError(t, json.Unmarshal(msg.Data, &ev))
	require.Equal(t, dispatch.WeightEvent{Queue: "orders.eu", Key: "k", Kind: "weight"}, ev)

	qres, err := weights.SetQuota(ctx, shardsOf(db), "ops", "orders.eu", "acme", api.Quota{MaxConcurrent: ptr(2)}, weights.WithNATS(nc, subj))
	require.NoError(t, err)
	require.Equal(t, 200, qres.Status())
	msg, err = sub.NextMsg(5 * time.Second)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(msg.Data, &ev))
	require.Equal(t, dispatch.WeightEvent{Queue: "orders.eu", Key: "acme", Kind: "quota"}, ev)

	// A closed connection does not fail the write.
	nc.Close()
	res, err = weights.Set(ctx, shardsOf(db), "ops", "orders.eu", "k", 5, weights.WithNATS(nc, subj))
	require.NoError(t, err)
	require.Equal(t, 200, res.Status())
	require.Error(t, res.PublishErr)
	require.Equal(t, map[string]float64{"k": 5}, overrides(t, db, "orders.eu"))
}

func TestQuotaFanoutAndRecheck(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	a := testsvc.NewDB(t)
	dead := deadPool(t)
	q := api.Quota{MaxConcurrent: ptr(1), Rate: ptr(100.0), Burst: ptr(10.0)}
	res, err := weights.SetQuota(ctx, shardsOf(a, dead), "ops", "jobs", "acme", q)
	require.NoError(t, err)
	require.Equal(t, http.StatusMultiStatus, res.Status())
	body, err := json.Marshal(res)
	require.NoError(t, err)
	var wire map[string]any
	require.NoError(t, json.Unmarshal(body, &wire))
	require.Equal(t, 1.0, wire["max_concurrent"])
	require.Equal(t, 100.0, wire["rate"])
	require.Equal(t, 10.0, wire["burst"])
	require.Equal(t, "acme", wire["quota_key"])

	read, err := weights.GetQuota(ctx, shardsOf(a, dead), "jobs", "acme")
	require.NoError(t, err)
	require.Equal(t, []int{1}, read.UnavailableShards)
	require.Len(t, read.Quotas, 1)
	require.Equal(t, q, read.Quotas[0].Quota)

	b := testsvc.NewDB(t)
	read, err = weights.GetQuota(ctx, shardsOf(a, b), "jobs", "")
	require.NoError(t, err)
	require.False(t, read.QuotasUniform)
	require.Equal(t, api.Quota{}, read.Shards[1].Quotas[0].Quota, "shard 1 has no quota: all null")
	res, err = weights.SetQuota(ctx, shardsOf(a, b), "ops", "jobs", "acme", q)
	require.NoError(t, err)
	require.Equal(t, 200, res.Status())
	read, err = weights.GetQuota(ctx, shardsOf(a, b), "jobs", "acme")
	require.NoError(t, err)
	require.True(t, read.QuotasUniform)

	// The claim's recheck applies the cap at the next claim.
	due := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	flood(t, a, "jobs", "", "acme", 3, due)
	r1, err := claim.Claim(ctx, a, claim.Request{Queue: "jobs", Worker: "w"})
	require.NoError(t, err)
	require.True(t, r1.OK)
	r2, err := claim.Claim(ctx, a, claim.Request{Queue: "jobs", Worker: "w"})
	require.NoError(t, err)
	require.False(t, r2.OK)
	require.Equal(t, claim.ReasonConcurrencyCap, r2.Refused[0].Reason)
	// Raise the cap: the very next claim takes a second task.
	res, err = weights.SetQuota(ctx, shardsOf(a), "ops", "jobs", "acme", api.Quota{MaxConcurrent: ptr(2)})
	require.NoError(t, err)
	require.Equal(t, 200, res.Status())
	r3, err := claim.Claim(ctx, a, claim.Request{Queue: "jobs", Worker: "w"})
	require.NoError(t, err)
	require.True(t, r3.OK)
	// Clear it: no limit at all.
	cl, err := weights.ClearQuota(ctx, shardsOf(a, b), "ops", "jobs", "acme")
	require.NoError(t, err)
	require.Equal(t, 200, cl.Status())
	r4, err := claim.Claim(ctx, a, claim.Request{Queue: "jobs", Worker: "w"})
	require.NoError(t, err)
	require.True(t, r4.OK)

	require.Len(t, auditRows(t, a), 4)
	require.Len(t, auditRows(t, b), 2)
}

func TestKeysView(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	a := testsvc.NewDB(t)
	due := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	flood(t, a, "shared", "big", "", 10, due)
	flood(t, a, "shared", "small", "", 3, due)
	_, err := weights.SetOne(ctx, a, "ops", "shared", "big", 2)
	require.NoError(t, err)
	_, err = weights.SetOne(ctx, a, "ops", "shared", "idle", 0.5)
	require.NoError(t, err)
	for i := 0; i < 4; i++ {
		r, err := claim.Claim(ctx, a, claim.Request{Queue: "shared", Worker: "w", Fair: true})
		require.NoError(t, err)
		require.True(t, r.OK)
	}
	res, err := weights.Keys(ctx, shardsOf(a, deadPool(t)), "shared", 0)
	require.NoError(t, err)
	require.Equal(t, 200, res.Status())
	require.Equal(t, []int{1}, res.UnavailableShards)
	require.Equal(t, "unavailable", res.Shards[1].Outcome)
	s := res.Shards[0]
	require.Equal(t, "ok", s.Outcome)
	byKey := map[string]api.KeyView{}
	for _, k := range s.Keys {
		byKey[k.Key] = k
	}
	require.Len(t, byKey, 3)
	big, small, idle := byKey["big"], byKey["small"], byKey["idle"]
	require.Equal(t, 2.0, big.Weight)
	require.True(t, big.Overridden)
	require.Equal(t, 1.0, small.Weight)
	require.Equal(t, 0.5, idle.Weight)
	require.Equal(t, 0, idle.Pending)
	require.Nil(t, idle.Pass)
	require.Equal(t, 10+3-4, big.Pending+small.Pending)
	require.Equal(t, 4, big.ClaimsLastMinute+small.ClaimsLastMinute)
	require.NotNil(t, big.Pass)
	require.NotNil(t, big.ChargedAt)
	// Lags are measured from the queue clock: the key that ran last is in
	// debt, and no lag is negative.
	require.GreaterOrEqual(t, big.Lag, 0.0)
	require.GreaterOrEqual(t, small.Lag, 0.0)
	require.InDelta(t, *big.Pass-s.Clock, big.Lag, 1e-9)

	// Limit and truncation.
	res, err = weights.Keys(ctx, shardsOf(a), "shared", 2)
	require.NoError(t, err)
	require.Len(t, res.Shards[0].Keys, 2)
	require.True(t, res.Shards[0].Truncated)
}
