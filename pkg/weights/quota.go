package weights

import (
	"context"
	"fmt"
	"sort"

	routing "github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/shard"
)

// SetQuota replaces the quota of (queue, quotaKey) on every shard. The
// error is non-nil only for invalid arguments (an *api.Error naming the
// field), in which case no shard was written.
func SetQuota(ctx context.Context, shards []Shard, actor, queue, quotaKey string, q api.Quota, opts ...Option) (api.QuotaWriteResult, error) {
	if err := validateQuotaWrite(actor, queue, quotaKey); err != nil {
		return api.QuotaWriteResult{}, err
	}
	if err := q.Validate(); err != nil {
		return api.QuotaWriteResult{}, err
	}
	if err := checkShards(shards); err != nil {
		return api.QuotaWriteResult{}, err
	}
	o := collect(opts)
	res := call(ctx, shards, o, func(ctx context.Context, db shard.Querier) (QuotaChange, error) {
		return SetQuotaOne(ctx, db, actor, queue, quotaKey, q)
	})
	out := api.QuotaWriteResult{Queue: queue, QuotaKey: quotaKey, Quota: q}
	for _, r := range res {
		out.Shards = append(out.Shards, outcomeOf(r.Shard, r.Err))
	}
	out.Message = writeMessage("set", out.Shards)
	out.PublishErr = o.publish(ctx, out.Shards, queue, quotaKey, "quota")
	return out, nil
}

// ClearQuota removes the quota of (queue, quotaKey) on every shard.
func ClearQuota(ctx context.Context, shards []Shard, actor, queue, quotaKey string, opts ...Option) (api.QuotaWriteResult, error) {
	if err := validateQuotaWrite(actor, queue, quotaKey); err != nil {
		return api.QuotaWriteResult{}, err
	}
	if err := checkShards(shards); err != nil {
		return api.QuotaWriteResult{}, err
	}
	o := collect(opts)
	res := call(ctx, shards, o, func(ctx context.Context, db shard.Querier) (QuotaChange, error) {
		return ClearQuotaOne(ctx, db, actor, queue, quotaKey)
	})
	out := api.QuotaWriteResult{Queue: queue, QuotaKey: quotaKey}
	for _, r := range res {
		out.Shards = append(out.Shards, outcomeOf(r.Shard, r.Err))
	}
	out.Message = writeMessage("cleared", out.Shards)
	out.PublishErr = o.publish(ctx, out.Shards, queue, quotaKey, "quota")
	return out, nil
}

// GetQuota reads the quotas of queue (of quotaKey alone when it is not
// empty) from every shard and compares them.
func GetQuota(ctx context.Context, shards []Shard, queue, quotaKey string, opts ...Option) (api.QuotaReadResult, error) {
	if err := ValidateQueue(queue); err != nil {
		return api.QuotaReadResult{}, err
	}
	if quotaKey != "" {
		if err := ValidateQuotaKey(quotaKey); err != nil {
			return api.QuotaReadResult{}, err
		}
	}
	if err := checkShards(shards); err != nil {
		return api.QuotaReadResult{}, err
	}
	o := collect(opts)
	res := call(ctx, shards, o, func(ctx context.Context, db shard.Querier) ([]api.QuotaEntry, error) {
		all, err := ListQuotas(ctx, db, queue, quotaKey)
		return ownedOnly(all, err, o.owner, func(q api.QuotaEntry) string { return q.QuotaKey })
	})
	out := api.QuotaReadResult{Queue: queue, Quotas: []api.QuotaEntry{}, QuotasUniform: true, UnavailableShards: routing.Unavailable(res)}
	per := map[string]map[int]api.QuotaEntry{}
	var answered []int
	detail := make([]api.ShardQuotas, len(res))
	for i, r := range res {
		so := outcomeOf(r.Shard, r.Err)
		detail[i] = api.ShardQuotas{Shard: r.Shard, Outcome: so.Outcome, Message: so.Message, Quotas: []api.QuotaEntry{}}
		if r.Err != nil {
			continue
		}
		answered = append(answered, i)
		for _, e := range r.Value {
			if per[e.QuotaKey] == nil {
				per[e.QuotaKey] = map[int]api.QuotaEntry{}
			}
			per[e.QuotaKey][i] = e
		}
	}
	keys := make([]string, 0, len(per))
	for k := range per {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		es := per[k]
		var first api.QuotaEntry
		agree := len(es) == len(answered)
		for j, i := range answered {
			e, ok := es[i]
			if j == 0 {
				first = e
			}
			if !ok || !quotaEqual(e.Quota, first.Quota) {
				agree = false
			}
		}
		if agree {
			out.Quotas = append(out.Quotas, first)
			continue
		}
		out.QuotasUniform = false
		for _, i := range answered {
			e, ok := es[i]
			if !ok {
				e = api.QuotaEntry{QuotaKey: k} // no quota on this shard: all null
			}
			detail[i].Quotas = append(detail[i].Quotas, e)
		}
	}
	if !out.QuotasUniform || len(out.UnavailableShards) > 0 {
		out.Shards = detail
	}
	switch {
	case len(answered) == 0:
		out.Message = "no shard answered"
	case !out.QuotasUniform:
		out.Message = "the shards disagree; quotas lists what they agree on, shards shows the rest: set or clear those quotas again"
	case len(out.UnavailableShards) > 0:
		out.Message = fmt.Sprintf("shard %s did not answer; the other shards agree", joinInts(out.UnavailableShards))
	}
	return out, nil
}

// Keys lists, per shard, the keys of queue with their weight, pass, lag,
// pending tasks and claims in the last minute, and whether the queue is
// paused there (at most limit keys per
// shard; DefaultKeyLimit when limit <= 0). Lags compare only within one
// shard: each shard has its own queue clock.
func Keys(ctx context.Context, shards []Shard, queue string, limit int, opts ...Option) (api.KeysResult, error) {
	if err := ValidateQueue(queue); err != nil {
		return api.KeysResult{}, err
	}
	if limit > MaxKeyLimit {
		return api.KeysResult{}, ValidateLimit(limit)
	}
	if err := checkShards(shards); err != nil {
		return api.KeysResult{}, err
	}
	o := collect(opts)
	res := call(ctx, shards, o, func(ctx context.Context, db shard.Querier) (api.ShardKeyList, error) {
		return keysOne(ctx, db, queue, o.owner, limit)
	})
	out := api.KeysResult{Queue: queue, Shards: []api.ShardKeys{}, UnavailableShards: routing.Unavailable(res), PausedShards: []int{}}
	for _, r := range res {
		so := outcomeOf(r.Shard, r.Err)
		sk := api.ShardKeys{Shard: r.Shard, Outcome: so.Outcome, Message: so.Message, ShardKeyList: r.Value}
		if r.Err != nil {
			sk.Keys = []api.KeyView{}
		}
		if sk.Paused != nil {
			out.PausedShards = append(out.PausedShards, r.Shard)
		}
		out.Shards = append(out.Shards, sk)
	}
	return out, nil
}

// quotaEqual reports whether two quotas set the same limits.
func quotaEqual(q, o api.Quota) bool {
	eqI := func(a, b *int) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
	eqF := func(a, b *float64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
	return eqI(q.MaxConcurrent, o.MaxConcurrent) && eqF(q.Rate, o.Rate) && eqF(q.Burst, o.Burst)
}
