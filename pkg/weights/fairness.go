package weights

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/pgrow"
	routing "github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/internal/sqlfile"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/fairkeys"
	"github.com/harvest-run/harvest/pkg/shard"
)

var (
	sqlQueueFairnessSetOne = sqlfile.Must(sqlFiles, "QueueFairnessSetOne")
	sqlQueueFairnessGet    = sqlfile.Must(sqlFiles, "QueueFairnessGet")
	sqlGroupWeightSetOne   = sqlfile.Must(sqlFiles, "GroupWeightSetOne")
	sqlGroupWeightList     = sqlfile.Must(sqlFiles, "GroupWeightList")
)

// MaxGroupWeights is how many group weights a read lists per shard; an
// operator sets them by hand, so a queue has few.
const MaxGroupWeights = 1000

// Audit actions of the fairness settings.
const (
	ActionQueueFairness    = "queue.fairness"
	ActionGroupWeightSet   = "group_weight.set"
	ActionGroupWeightClear = "group_weight.clear"
)

// defaultFairnessCharge is a queue's charge until one is set.
const defaultFairnessCharge = api.ChargeClaims

// ValidateFairness checks a fairness change: charge, when given, is
// "claims" or "runtime", and at least one field is given.
func ValidateFairness(req api.QueueFairnessRequest) error {
	if req.TwoLevel == nil && req.Charge == nil {
		return api.Invalid("two_level", "give two_level, charge or both")
	}
	if req.Charge != nil {
		if err := fairkeys.ValidateCharge(fairkeys.Charge(*req.Charge)); err != nil {
			return api.Invalid("charge", "charge %v", err)
		}
	}
	return nil
}

// ValidateGroup checks a group name: the tenant part of fairness keys,
// so it must be a valid key without "/".
func ValidateGroup(group string) error {
	if err := fairkeys.ValidateKey(group); err != nil {
		return api.Invalid("group", "group %v", err)
	}
	if fairkeys.GroupOf(group) != group {
		return api.Invalid("group", "group must not hold %q: it is the part of a key before the first one", "/")
	}
	return nil
}

// FairnessSetOne sets the fairness modes of queue on the shard of db and
// writes the audit row in the same statement. It takes the queue's fair
// lock, so it waits for a fair claim of the queue under way.
func FairnessSetOne(ctx context.Context, db shard.Querier, actor, queue string, req api.QueueFairnessRequest) (api.QueueFairness, bool, error) {
	if err := validateActor(actor); err != nil {
		return api.QueueFairness{}, false, err
	}
	if err := ValidateQueue(queue); err != nil {
		return api.QueueFairness{}, false, err
	}
	if err := ValidateFairness(req); err != nil {
		return api.QueueFairness{}, false, err
	}
	var (
		out     api.QueueFairness
		changed bool
		at      *time.Time
		by      *string
	)
	if err := db.QueryRow(ctx, sqlQueueFairnessSetOne, queue, req.TwoLevel, req.Charge, actor).
		Scan(&changed, &out.TwoLevel, &out.Charge, &at, &by); err != nil {
		return api.QueueFairness{}, false, mapError("set queue fairness", err)
	}
	fill(&out, at, by)
	return out, changed, nil
}

// FairnessOne reads the fairness modes of queue on the shard of db.
func FairnessOne(ctx context.Context, db shard.Querier, queue string) (api.QueueFairness, error) {
	out := api.QueueFairness{Charge: defaultFairnessCharge}
	r, err := pgrow.One[fairnessRow](ctx, db, sqlQueueFairnessGet, queue)
	configured := !errors.Is(err, pgx.ErrNoRows)
	if configured && err != nil {
		return api.QueueFairness{}, mapError("read queue fairness", err)
	}
	if configured {
		out.TwoLevel, out.Charge = r.TwoLevel, r.Charge
		fill(&out, &r.UpdatedAt, &r.UpdatedBy)
	}
	rows, err := db.Query(ctx, sqlGroupWeightList, queue, MaxGroupWeights)
	if err != nil {
		return api.QueueFairness{}, mapError("read group weights", err)
	}
	gw, err := pgx.CollectRows(rows, pgx.RowToStructByName[api.GroupWeight])
	if err != nil {
		return api.QueueFairness{}, mapError("read group weights", err)
	}
	out.GroupWeights = gw
	return out, nil
}

func fill(f *api.QueueFairness, at *time.Time, by *string) {
	if at != nil {
		f.UpdatedAt = &api.Time{Time: *at}
	}
	if by != nil {
		f.UpdatedBy = *by
	}
}

// SetFairness sets queue's fairness modes on every shard. The error is
// non-nil only for invalid arguments (an *api.Error, status 400), and then
// no shard was written; each shard's fate is in the result (200, 207 or
// 503 by Status). It is idempotent: after a 207, send it again.
func SetFairness(ctx context.Context, shards []Shard, actor, queue string, req api.QueueFairnessRequest, opts ...Option) (api.QueueFairnessResult, error) {
	if err := validateActor(actor); err != nil {
		return api.QueueFairnessResult{}, err
	}
	if err := ValidateQueue(queue); err != nil {
		return api.QueueFairnessResult{}, err
	}
	if err := ValidateFairness(req); err != nil {
		return api.QueueFairnessResult{}, err
	}
	if err := checkShards(shards); err != nil {
		return api.QueueFairnessResult{}, err
	}
	type set struct {
		f       api.QueueFairness
		changed bool
	}
	res := call(ctx, shards, collect(opts), func(ctx context.Context, db shard.Querier) (set, error) {
		f, changed, err := FairnessSetOne(ctx, db, actor, queue, req)
		return set{f, changed}, err
	})
	out := api.QueueFairnessResult{Queue: queue, Shards: []api.QueueFairnessShard{}, UnavailableShards: routing.Unavailable(res)}
	for _, r := range res {
		out.Shards = append(out.Shards, api.QueueFairnessShard{ShardOutcome: outcomeOf(r.Shard, r.Err),
			Fairness: r.Value.f, Changed: r.Value.changed})
	}
	return out, nil
}

// Fairness reads queue's fairness modes on every shard. With WithOwner it
// is a tenant's view: the group weights of the tenant's own group only
// (the group of the keys bound to it), and not who changed the modes (an
// operator's token); the modes themselves apply to every tenant and are
// shown whole.
func Fairness(ctx context.Context, shards []Shard, queue string, opts ...Option) (api.QueueFairnessResult, error) {
	if err := ValidateQueue(queue); err != nil {
		return api.QueueFairnessResult{}, err
	}
	if err := checkShards(shards); err != nil {
		return api.QueueFairnessResult{}, err
	}
	o := collect(opts)
	res := call(ctx, shards, o, func(ctx context.Context, db shard.Querier) (api.QueueFairness, error) {
		f, err := FairnessOne(ctx, db, queue)
		if err != nil || o.owner == "" {
			return f, err
		}
		f.UpdatedBy = ""
		// A group is the tenant part of a key, so the tenant's own group
		// is the one named after it (fairkeys.BoundTo holds for it alone).
		f.GroupWeights, _ = ownedOnly(f.GroupWeights, nil, o.owner, func(g api.GroupWeight) string { return g.Group })
		return f, nil
	})
	out := api.QueueFairnessResult{Queue: queue, Shards: []api.QueueFairnessShard{}, UnavailableShards: routing.Unavailable(res)}
	for _, r := range res {
		out.Shards = append(out.Shards, api.QueueFairnessShard{ShardOutcome: outcomeOf(r.Shard, r.Err), Fairness: r.Value})
	}
	return out, nil
}

// SetGroupWeight sets (weight non-nil) or clears the weight of a group in
// a two-level queue on every shard, audited on each; the weight applies
// from the group's next charge. Same error and status rules as
// SetFairness.
func SetGroupWeight(ctx context.Context, shards []Shard, actor, queue, group string, weight *float64, opts ...Option) (api.GroupWeightResult, error) {
	if err := validateActor(actor); err != nil {
		return api.GroupWeightResult{}, err
	}
	if err := ValidateQueue(queue); err != nil {
		return api.GroupWeightResult{}, err
	}
	if err := ValidateGroup(group); err != nil {
		return api.GroupWeightResult{}, err
	}
	if weight != nil {
		if err := ValidateWeight(*weight); err != nil {
			return api.GroupWeightResult{}, err
		}
	}
	if err := checkShards(shards); err != nil {
		return api.GroupWeightResult{}, err
	}
	res := call(ctx, shards, collect(opts), func(ctx context.Context, db shard.Querier) (*float64, error) {
		var old *float64
		if err := db.QueryRow(ctx, sqlGroupWeightSetOne, queue, group, weight, actor).Scan(&old); err != nil {
			return nil, mapError("set group weight", err)
		}
		return old, nil
	})
	out := api.GroupWeightResult{Queue: queue, Group: group, Weight: weight, Shards: []api.GroupWeightShard{}, UnavailableShards: routing.Unavailable(res)}
	for _, r := range res {
		out.Shards = append(out.Shards, api.GroupWeightShard{ShardOutcome: outcomeOf(r.Shard, r.Err), OldWeight: r.Value})
	}
	return out, nil
}
