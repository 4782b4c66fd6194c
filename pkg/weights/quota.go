package weights

import (
	"context"
	"fmt"
	"sort"
)

// SetQuota replaces the quota of (queue, quotaKey) on every shard. The
// error is non-nil only for invalid arguments (an *api.Error naming the
// field), in which case no shard was written.
func SetQuota(ctx context.Context, shards []Shard, actor, queue, quotaKey string, q Quota, opts ...Option) (QuotaWriteResult, error) {
	if err := validateQuotaWrite(actor, queue, quotaKey); err != nil {
		return QuotaWriteResult{}, err
	}
	if err := q.Validate(); err != nil {
		return QuotaWriteResult{}, err
	}
	if err := checkShards(shards); err != nil {
		return QuotaWriteResult{}, err
	}
	o := collect(opts)
	res := call(ctx, shards, o, func(ctx context.Context, db DB) (QuotaChange, error) {
		return SetQuotaOne(ctx, db, actor, queue, quotaKey, q)
	})
	out := QuotaWriteResult{Queue: queue, QuotaKey: quotaKey, Quota: q}
	for _, r := range res {
		out.Shards = append(out.Shards, outcomeOf(r.Shard, r.Err))
	}
	out.Message = writeMessage("set", out.Shards)
	out.PublishErr = o.publish(ctx, out.Shards, queue, quotaKey, "quota")
	return out, nil
}

// ClearQuota removes the quota of (queue, quotaKey) on every shard.
func ClearQuota(ctx context.Context, shards []Shard, actor, queue, quotaKey string, opts ...Option) (QuotaWriteResult, error) {
	if err := validateQuotaWrite(actor, queue, quotaKey); err != nil {
		return QuotaWriteResult{}, err
	}
	if err := checkShards(shards); err != nil {
		return QuotaWriteResult{}, err
	}
	o := collect(opts)
	res := call(ctx, shards, o, func(ctx context.Context, db DB) (QuotaChange, error) {
		return ClearQuotaOne(ctx, db, actor, queue, quotaKey)
	})
	out := QuotaWriteResult{Queue: queue, QuotaKey: quotaKey}
	for _, r := range res {
		out.Shards = append(out.Shards, outcomeOf(r.Shard, r.Err))
	}
	out.Message = writeMessage("cleared", out.Shards)
	out.PublishErr = o.publish(ctx, out.Shards, queue, quotaKey, "quota")
	return out, nil
}

// GetQuota reads the quotas of queue (of quotaKey alone when it is not
// empty) from every shard and compares them.
func GetQuota(ctx context.Context, shards []Shard, queue, quotaKey string, opts ...Option) (QuotaReadResult, error) {
	if err := ValidateQueue(queue); err != nil {
		return QuotaReadResult{}, err
	}
	if quotaKey != "" {
		if err := ValidateQuotaKey(quotaKey); err != nil {
			return QuotaReadResult{}, err
		}
	}
	if err := checkShards(shards); err != nil {
		return QuotaReadResult{}, err
	}
	o := collect(opts)
	res := call(ctx, shards, o, func(ctx context.Context, db DB) ([]QuotaEntry, error) {
		all, err := ListQuotas(ctx, db, queue, quotaKey)
		return ownedOnly(all, err, o.owner, func(q QuotaEntry) string { return q.QuotaKey })
	})
	out := QuotaReadResult{Queue: queue, Quotas: []QuotaEntry{}, QuotasUniform: true, UnavailableShards: []int{}}
	per := map[string]map[int]QuotaEntry{}
	var answered []int
	detail := make([]ShardQuotas, len(res))
	for i, r := range res {
		so := outcomeOf(r.Shard, r.Err)
		detail[i] = ShardQuotas{Shard: r.Shard, Outcome: so.Outcome, Message: so.Message, Quotas: []QuotaEntry{}}
		if r.Err != nil {
			out.UnavailableShards = append(out.UnavailableShards, r.Shard)
			continue
		}
		answered = append(answered, i)
		for _, e := range r.Value {
			if per[e.QuotaKey] == nil {
				per[e.QuotaKey] = map[int]QuotaEntry{}
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
		var first QuotaEntry
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
				e = QuotaEntry{QuotaKey: k} // no quota on this shard: all null
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
func Keys(ctx context.Context, shards []Shard, queue string, limit int, opts ...Option) (KeysResult, error) {
	if err := ValidateQueue(queue); err != nil {
		return KeysResult{}, err
	}
	if limit > MaxKeyLimit {
		return KeysResult{}, ValidateLimit(limit)
	}
	if err := checkShards(shards); err != nil {
		return KeysResult{}, err
	}
	o := collect(opts)
	res := call(ctx, shards, o, func(ctx context.Context, db DB) (ShardKeyList, error) {
		return keysOne(ctx, db, queue, o.owner, limit)
	})
	out := KeysResult{Queue: queue, Shards: []ShardKeys{}, UnavailableShards: []int{}, PausedShards: []int{}}
	for _, r := range res {
		so := outcomeOf(r.Shard, r.Err)
		sk := ShardKeys{Shard: r.Shard, Outcome: so.Outcome, Message: so.Message, ShardKeyList: r.Value}
		if r.Err != nil {
			sk.Keys = []KeyView{}
			out.UnavailableShards = append(out.UnavailableShards, r.Shard)
		}
		if sk.Paused != nil {
			out.PausedShards = append(out.PausedShards, r.Shard)
		}
		out.Shards = append(out.Shards, sk)
	}
	return out, nil
}
