package gateway

import (
	"encoding/json"
	"fmt"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
	"github.com/harvest-run/harvest/pkg/weights"
)

func outcomesOf(shards []api.ShardOutcome) []string {
	out := make([]string, len(shards))
	for i, s := range shards {
		out[i] = s.Outcome
	}
	return out
}

// Both shards behind proxies: writes answer 200, 207 (one shard down) and
// 503 (both down); a read names the shard that did not answer and, once it
// is back, reports that the shards disagree; sending the write again
// converges. The typed client returns the same results.
func TestWeightsRoutesPartialAndConvergence(t *testing.T) {
	t.Parallel()
	p0, u0 := newShardProxy(t, testsvc.NewDBURL(t))
	p1, u1 := newShardProxy(t, testsvc.NewDBURL(t))
	b := setup(t, setupOpts{Shards: []string{u0, u1}})
	c := b.client(t, secretRoot)

	res, err := c.SetWeight(b.ctx, "shared", "tenant-1", 2)
	require.NoError(t, err)
	require.Equal(t, 200, res.Status())
	require.Equal(t, []string{"ok", "ok"}, outcomesOf(res.Shards))

	p1.down()
	status, out := b.call(t, "PUT", "/v1/queues/shared/weights/tenant-42", secretRoot, `{"weight": 4}`)
	require.Equal(t, 207, status, string(out))
	wr := decode[api.WeightWriteResult](t, out)
	require.Equal(t, []string{"ok", "unavailable"}, outcomesOf(wr.Shards))
	require.Contains(t, wr.Message, "send the same request again")

	status, out = b.call(t, "GET", "/v1/queues/shared/weights", secretWRead, nil)
	require.Equal(t, 200, status, string(out))
	rr := decode[api.WeightReadResult](t, out)
	require.Equal(t, []int{1}, rr.UnavailableShards)
	require.True(t, rr.WeightsUniform)

	p0.down()
	status, out = b.call(t, "DELETE", "/v1/queues/shared/weights/tenant-1", secretRoot, nil)
	require.Equal(t, 503, status, string(out))
	require.Equal(t, []string{"unavailable", "unavailable"}, outcomesOf(decode[api.WeightWriteResult](t, out).Shards))
	status, _ = b.call(t, "GET", "/v1/queues/shared/weights", secretWRead, nil)
	require.Equal(t, 503, status)
	res, err = c.ClearWeight(b.ctx, "shared", "tenant-1")
	require.NoError(t, err, "a 503 with a per-shard body is a result")
	require.Equal(t, 503, res.Status())

	p0.up()
	p1.up()
	read, err := c.GetWeights(b.ctx, "shared")
	require.NoError(t, err)
	require.Equal(t, 200, read.Status())
	require.Empty(t, read.UnavailableShards)
	require.False(t, read.WeightsUniform, "shard 1 missed tenant-42")
	require.Len(t, read.Shards, 2)

	res, err = c.SetWeight(b.ctx, "shared", "tenant-42", 4)
	require.NoError(t, err)
	require.Equal(t, 200, res.Status())
	read, err = c.GetWeights(b.ctx, "shared")
	require.NoError(t, err)
	require.True(t, read.WeightsUniform)
	require.Len(t, read.Overrides, 2)

	// 409 wins when a shard is at the cap; the body says which.
	_, err = b.dbs[1].Exec(b.ctx, `INSERT INTO weight_overrides (queue, key, weight)
		SELECT 'full', 'k' || lpad(i::text, 4, '0'), 2 FROM generate_series(1, $1) i`, weights.MaxOverrides)
	require.NoError(t, err)
	status, out = b.call(t, "PUT", "/v1/queues/full/weights/new-key", secretRoot, `{"weight": 3}`)
	require.Equal(t, 409, status, string(out))
	wr = decode[api.WeightWriteResult](t, out)
	require.Equal(t, []string{"ok", "cap_reached"}, outcomesOf(wr.Shards))
	require.Contains(t, wr.Message, "refused on shard 1")
	res, err = c.SetWeight(b.ctx, "full", "new-key", 3)
	require.NoError(t, err)
	require.Equal(t, 409, res.Status())
}

// Queue names and keys with dots, spaces and slashes survive the path;
// bodies with unknown fields are refused naming the field; tokens are
// checked (401, 403); the audit rows name the token.
func TestWeightsRoutesNamesAndErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	c := b.client(t, secretRoot)
	for _, q := range []string{"orders.eu", "my queue"} {
		key := "a/b c"
		status, out := b.call(t, "PUT", "/v1/queues/"+url.PathEscape(q)+"/weights/"+url.PathEscape(key), secretRoot, `{"weight": 2.5}`)
		require.Equal(t, 200, status, string(out))
		wr := decode[api.WeightWriteResult](t, out)
		require.Equal(t, q, wr.Queue)
		require.Equal(t, key, wr.Key)
		for i := range 2 {
			require.Equal(t, 1, b.count(t, i, `SELECT count(*) FROM weight_overrides WHERE queue = $1 AND key = $2 AND weight = 2.5`, q, key))
		}
		read, err := c.GetWeights(b.ctx, q)
		require.NoError(t, err)
		require.Equal(t, q, read.Queue)
		require.Len(t, read.Overrides, 1)
		require.Equal(t, key, read.Overrides[0].Key)
		res, err := c.ClearWeight(b.ctx, q, key)
		require.NoError(t, err)
		require.Equal(t, 200, res.Status())
	}

	for _, tc := range []struct {
		method, path, secret, body string
		status                     int
		field                      string
	}{
		{"PUT", "/v1/queues/q/weights/k", secretRoot, `{"wieght": 2}`, 400, "wieght"},
		{"PUT", "/v1/queues/q/weights/k", secretRoot, `{"weight": 2, "extra": 1}`, 400, "extra"},
		{"PUT", "/v1/queues/q/weights/k", secretRoot, `{"weight": 0}`, 400, "weight"},
		{"PUT", "/v1/queues/q/weights/k", secretRoot, `{"weight": "x"}`, 400, "weight"},
		{"PUT", "/v1/queues/q/weights/k", secretRoot, `{}`, 400, "weight"},
		{"PUT", "/v1/queues/q/quotas/qk", secretRoot, `{"max_concurrent": 2, "burts": 1}`, 400, "burts"},
		{"GET", "/v1/queues/q/keys?limit=0", secretRoot, ``, 400, "limit"},
		{"GET", "/v1/queues/q/weights?x=1", secretRoot, ``, 400, "x"},
		{"GET", "/v1/audit?cursor=nope", secretRoot, ``, 400, "cursor"},
		{"GET", "/v1/audit?shard=9", secretRoot, ``, 400, "shard"},
		{"PUT", "/v1/queues/q/weights/k", "", `{"weight": 2}`, 401, ""},
		{"PUT", "/v1/queues/q/weights/k", "nope", `{"weight": 2}`, 401, ""},
		{"PUT", "/v1/queues/q/weights/k", secretWRead, `{"weight": 2}`, 403, ""},
		{"DELETE", "/v1/queues/q/weights/k", secretA, ``, 403, ""},
		{"GET", "/v1/queues/q/weights", secretA, ``, 403, ""},
		{"GET", "/v1/queues/q/keys", secretAdmin, ``, 403, ""},
		{"PUT", "/v1/queues/q/quotas/qk", secretWRead, `{"max_concurrent": 2}`, 403, ""},
		{"GET", "/v1/audit", secretWRead, ``, 403, ""},
	} {
		var body any
		if tc.body != "" {
			body = tc.body
		}
		status, out := b.call(t, tc.method, tc.path, tc.secret, body)
		require.Equal(t, tc.status, status, "%s %s %s: %s", tc.method, tc.path, tc.body, out)
		e := apiErr(t, out)
		require.Equal(t, tc.field, e.Field, "%s %s %s: %s", tc.method, tc.path, tc.body, out)
	}
	// A weight refused at validation touched no shard.
	require.Zero(t, b.count(t, 0, `SELECT count(*) FROM weight_overrides WHERE queue = 'q'`))

	// Quotas: set, read, clear, each on every shard.
	mc := 3
	qr, err := c.SetQuota(b.ctx, "orders.eu", "tenant a", api.Quota{MaxConcurrent: &mc})
	require.NoError(t, err)
	require.Equal(t, 200, qr.Status())
	got, err := c.GetQuota(b.ctx, "orders.eu", "tenant a")
	require.NoError(t, err)
	require.True(t, got.QuotasUniform)
	require.Len(t, got.Quotas, 1)
	require.Equal(t, 3, *got.Quotas[0].MaxConcurrent)
	all, err := c.GetQuota(b.ctx, "orders.eu", "")
	require.NoError(t, err)
	require.Len(t, all.Quotas, 1)
	qr, err = c.ClearQuota(b.ctx, "orders.eu", "tenant a")
	require.NoError(t, err)
	require.Equal(t, 200, qr.Status())

	// Every change is audited with the token's name, and so are the
	// refused attempts of tokens without the privilege.
	page, err := c.Audit(b.ctx, client.AuditOptions{Limit: 100})
	require.NoError(t, err)
	require.NotEmpty(t, page.Entries)
	for _, e := range page.Entries {
		if e.Actor != "root" {
			require.Equal(t, "refused", e.Outcome, "%+v", e)
			continue
		}
		require.Equal(t, "root", e.Actor)
	}
}

// GET /v1/audit merges both shards newest first and pages through all of
// them with a cursor: every row once, in order.
func TestAuditPagingAcrossShards(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	c := b.client(t, secretRoot)
	for i := range 7 {
		res, err := c.SetWeight(b.ctx, "shared", fmt.Sprint("k", i), float64(i+1))
		require.NoError(t, err)
		require.Equal(t, 200, res.Status())
	}
	// One row on shard 0 only (admission lives there).
	_, err := c.SetAdmission(b.ctx, client.AdmissionChange{TFM: ptrTo(2.0)})
	require.NoError(t, err)
	total := b.count(t, 0, `SELECT count(*) FROM audit`) + b.count(t, 1, `SELECT count(*) FROM audit`)
	require.Equal(t, 15, total)

	var seen []AuditEntry
	ids := map[string]bool{}
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10)
		status, out := b.call(t, "GET", "/v1/audit?limit=4&cursor="+url.QueryEscape(cursor), secretAdmin, nil)
		require.Equal(t, 200, status, string(out))
		page := decode[AuditPage](t, out)
		require.LessOrEqual(t, len(page.Entries), 4)
		for _, e := range page.Entries {
			id := fmt.Sprint(e.Shard, "/", e.ID)
			require.False(t, ids[id], "row %s twice", id)
			ids[id] = true
			seen = append(seen, e)
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	require.Len(t, seen, total)
	for i := 1; i < len(seen); i++ {
		require.False(t, seen[i].At.After(seen[i-1].At.Time), "newest first")
	}
	require.Equal(t, "admission.set", seen[0].Action, "the latest change comes first")
	require.Equal(t, 0, seen[0].Shard)

	// One shard only.
	one := 1
	page, err := c.Audit(b.ctx, client.AuditOptions{Shard: &one, Limit: 100})
	require.NoError(t, err)
	require.Len(t, page.Entries, 7)
	for _, e := range page.Entries {
		require.Equal(t, 1, e.Shard)
	}
}

// GET /v1/queues/{queue}/keys lists each shard's keys with their figures.
func TestKeysRoute(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	nc := b.natsClient(t, tenantOn[0])
	for i := range 3 {
		_, err := nc.Start(b.ctx, "echo", "orders.eu", nil, clientOpts(fmt.Sprint("k", i), "big"))
		require.NoError(t, err)
	}
	c := b.client(t, secretWRead)
	res, err := c.Keys(b.ctx, "orders.eu", 10)
	require.NoError(t, err)
	require.Equal(t, 200, res.Status())
	require.Len(t, res.Shards, 2)
	require.Empty(t, res.UnavailableShards)
	home := b.gw.home(tenantOn[0])
	var found bool
	for _, k := range res.Shards[home].Keys {
		if k.Key == "big" {
			found = true
			require.Equal(t, 3, k.Pending)
			require.Equal(t, 1.0, k.Weight)
		}
	}
	require.True(t, found, "%+v", res.Shards[home])
}

func ptrTo[T any](v T) *T { return &v }

// A tenant's token with the weights privileges reads and writes only the
// keys bound to its tenant; an operator's token reads and writes them all.
func TestTenantTokenSeesOnlyItsOwnKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{KeyBinding: true})
	a, other := tenantOn[0], tenantOn[1]
	for _, k := range []string{a, a + "/vip", other, other + "/vip"} {
		status, out := b.call(t, "PUT", "/v1/queues/shared/weights/"+url.PathEscape(k), secretRoot, `{"weight": 2}`)
		require.Equal(t, 200, status, string(out))
		status, out = b.call(t, "PUT", "/v1/queues/shared/quotas/"+url.PathEscape(k), secretRoot, `{"max_concurrent": 3}`)
		require.Equal(t, 200, status, string(out))
	}
	// Work of both tenants, so that both have keys with pending tasks.
	for _, tenant := range []string{a, other} {
		status, out := b.natsCall(t, "harvest.start."+tenant, startBody(""))
		require.Equal(t, 201, status, string(out))
	}

	keysOf := func(secret string) (weightKeys, quotaKeys, listed []string) {
		status, out := b.call(t, "GET", "/v1/queues/shared/weights", secret, nil)
		require.Equal(t, 200, status, string(out))
		for _, o := range decode[api.WeightReadResult](t, out).Overrides {
			weightKeys = append(weightKeys, o.Key)
		}
		status, out = b.call(t, "GET", "/v1/queues/shared/quotas", secret, nil)
		require.Equal(t, 200, status, string(out))
		for _, q := range decode[api.QuotaReadResult](t, out).Quotas {
			quotaKeys = append(quotaKeys, q.QuotaKey)
		}
		status, out = b.call(t, "GET", "/v1/queues/shared/keys", secret, nil)
		require.Equal(t, 200, status, string(out))
		seen := map[string]bool{}
		for _, s := range decode[api.KeysResult](t, out).Shards {
			for _, k := range s.Keys {
				if !seen[k.Key] { // every shard lists the keys with a weight
					seen[k.Key] = true
					listed = append(listed, k.Key)
				}
			}
		}
		return weightKeys, quotaKeys, listed
	}
	w, q, k := keysOf(secretAOps)
	mine := []string{a, a + "/vip"}
	require.ElementsMatch(t, mine, w)
	require.ElementsMatch(t, mine, q)
	require.ElementsMatch(t, mine, k)
	w, q, k = keysOf(secretRoot)
	require.Len(t, w, 4)
	require.Len(t, q, 4)
	require.Len(t, k, 4)

	for _, req := range []struct{ method, path, body string }{
		{"PUT", "/v1/queues/shared/weights/" + url.PathEscape(other), `{"weight": 9}`},
		{"DELETE", "/v1/queues/shared/weights/" + url.PathEscape(other+"/vip"), ""},
		{"PUT", "/v1/queues/shared/quotas/" + url.PathEscape(other), `{"max_concurrent": 1}`},
		{"DELETE", "/v1/queues/shared/quotas/" + url.PathEscape(other), ""},
		{"PUT", "/v1/queues/shared/weights/" + url.PathEscape(a+"x"), `{"weight": 9}`},
	} {
		var body any
		if req.body != "" {
			body = req.body
		}
		status, out := b.call(t, req.method, req.path, secretAOps, body)
		require.Equal(t, 403, status, "%s %s: %s", req.method, req.path, out)
	}
	status, out := b.call(t, "PUT", "/v1/queues/shared/weights/"+url.PathEscape(a+"/vip"), secretAOps, `{"weight": 5}`)
	require.Equal(t, 200, status, string(out))
}

// A token without the privilege cannot flood the audit log: its refused
// attempts at one action share one row per minute, with a count. A
// privileged token's bad values fold the same way (per action and status),
// on the weight routes as on admission.
func TestRefusedChangesAreAuditedWithoutFlooding(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const tries = 40
	for range tries {
		status, _ := b.call(t, "PUT", "/v1/admission", secretA, `{"algorithm":"static"}`)
		require.Equal(t, 403, status)
		status, _ = b.call(t, "PUT", "/v1/queues/shared/weights/k", secretA, `{"weight": 2}`)
		require.Equal(t, 403, status)
		status, _ = b.call(t, "DELETE", "/v1/queues/shared/quotas/"+url.PathEscape(tenantOn[1]), secretAOps, nil)
		require.Equal(t, 403, status)
	}
	for range 2 {
		status, _ := b.call(t, "PUT", "/v1/queues/shared/weights/k", secretRoot, `{"weight": -1}`)
		require.Equal(t, 400, status)
	}
	status, out := b.call(t, "GET", "/v1/audit?limit=1000", secretRoot, nil)
	require.Equal(t, 200, status, string(out))
	type row struct {
		Actor, Action, Outcome, Message string
		Repeats                         int
	}
	var page struct{ Entries []row }
	require.NoError(t, json.Unmarshal(out, &page))
	got := map[string][]row{}
	for _, e := range page.Entries {
		got[e.Actor+" "+e.Action] = append(got[e.Actor+" "+e.Action], e)
	}
	for _, k := range []string{"a-ci admission.set", "a-ci weight.set", "a-ops quota.clear"} {
		require.Len(t, got[k], 1, "%s: %+v", k, page.Entries)
		require.Equal(t, "refused", got[k][0].Outcome)
		require.Equal(t, tries-1, got[k][0].Repeats, k)
		require.Contains(t, got[k][0].Message, "a-")
	}
	require.Len(t, got["root weight.set"], 1, "a privileged token's bad values fold too")
	require.Contains(t, got["root weight.set"][0].Message, "weight")
	require.Equal(t, 1, got["root weight.set"][0].Repeats)
}
