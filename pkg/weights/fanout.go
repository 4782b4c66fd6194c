package weights

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	routing "github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/dispatch"
	"github.com/harvest-run/harvest/pkg/fairkeys"
	"github.com/harvest-run/harvest/pkg/shard"
)

// Shard is one shard of the fleet: its index in HARVEST_SHARDS and a pool
// (or connection) on it. A pool for an unreachable shard is fine: its
// writes come back as api.ShardOutcomeUnavailable.
type Shard struct {
	Index int
	DB    shard.Querier
}

// DefaultShardTimeout bounds each shard's part of a fan-out, so one shard
// that hangs cannot hold the answer of the others.
const DefaultShardTimeout = 10 * time.Second

type options struct {
	nc       *nats.Conn
	subjects dispatch.Subjects
	timeout  time.Duration
	owner    string // WithOwner
}

// Option adjusts a fan-out.
type Option func(*options)

// WithNATS publishes a dispatch.WeightEvent on subjects.Weights(queue)
// after a write that at least one shard committed. A failed publish never
// fails the write (the database stays the source of truth; workers read
// weights at each claim anyway): it is reported in PublishErr.
func WithNATS(nc *nats.Conn, subjects dispatch.Subjects) Option {
	return func(o *options) { o.nc, o.subjects = nc, subjects }
}

// WithOwner limits a read (Get, GetQuota, Keys, Fairness) to the keys bound to
// tenant: the key named tenant and the keys under "tenant/", the names the
// gateway's key binding gives a tenant's keys. A gateway reads so for a
// tenant's token, so that no tenant sees another's keys, weights, quotas,
// backlog or claim rates.
func WithOwner(tenant string) Option {
	return func(o *options) { o.owner = tenant }
}

// ownedOnly keeps the items whose key is bound to owner (all of them when
// owner is empty, nothing on error).
func ownedOnly[T any](all []T, err error, owner string, key func(T) string) ([]T, error) {
	if err != nil || owner == "" {
		return all, err
	}
	mine := []T{}
	for _, it := range all {
		if fairkeys.BoundTo(key(it), owner) {
			mine = append(mine, it)
		}
	}
	return mine, nil
}

// WithShardTimeout replaces DefaultShardTimeout.
func WithShardTimeout(d time.Duration) Option {
	return func(o *options) { o.timeout = d }
}

func collect(opts []Option) options {
	o := options{timeout: DefaultShardTimeout}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// call runs fn on every shard at once, each under the shard timeout, and
// returns the answers in shard order (the module's one fan-out,
// internal/shards.Each).
func call[T any](ctx context.Context, shards []Shard, o options, fn func(ctx context.Context, db shard.Querier) (T, error)) []routing.Answer[T] {
	return routing.Each(ctx, shards, func(_ int, s Shard) int { return s.Index }, o.timeout,
		func(ctx context.Context, _ int, s Shard) (T, error) { return fn(ctx, s.DB) })
}

// outcomeOf is the wire form of one shard's answer (a routing.Answer's
// shard and error): the one place a shard's error becomes the outcome the
// API, the console and the CLI show for it.
func outcomeOf(shard int, err error) api.ShardOutcome {
	so := api.ShardOutcome{Shard: shard, Outcome: api.ShardOutcomeOK}
	switch {
	case err == nil:
	case errors.Is(err, ErrCapReached):
		so.Outcome, so.Message = api.ShardOutcomeCapReached, err.Error()
	case errors.Is(err, ErrUnavailable):
		so.Outcome, so.Message = api.ShardOutcomeUnavailable, err.Error()
	default:
		so.Outcome, so.Message = api.ShardOutcomeError, err.Error()
	}
	return so
}

func shardList(shards []api.ShardOutcome, outcome ...string) string {
	var n []string
	for _, s := range shards {
		for _, o := range outcome {
			if s.Outcome == o {
				n = append(n, fmt.Sprint(s.Shard))
			}
		}
	}
	return strings.Join(n, ", ")
}

// writeMessage explains a write's answer and what to do next.
func writeMessage(what string, shards []api.ShardOutcome) string {
	ok := 0
	for _, s := range shards {
		if s.Outcome == api.ShardOutcomeOK {
			ok++
		}
	}
	switch (api.WeightWriteResult{Shards: shards}).Status() {
	case http.StatusOK:
		return fmt.Sprintf("%s on all %d shards", what, len(shards))
	case http.StatusConflict:
		m := fmt.Sprintf("refused on shard %s: the queue holds %d overrides there, the most allowed; clear an override on that shard first, then send this request again",
			shardList(shards, api.ShardOutcomeCapReached), MaxOverrides)
		if ok > 0 {
			m += fmt.Sprintf(" (shard %s took it already)", shardList(shards, api.ShardOutcomeOK))
		}
		if rest := shardList(shards, api.ShardOutcomeUnavailable, api.ShardOutcomeError); rest != "" {
			m += fmt.Sprintf("; shard %s did not answer", rest)
		}
		return m
	case http.StatusMultiStatus:
		return fmt.Sprintf("%s on %d of %d shards; shard %s did not take it: send the same request again to bring every shard to the same setting",
			what, ok, len(shards), shardList(shards, api.ShardOutcomeUnavailable, api.ShardOutcomeError))
	default:
		return "no shard took the write, nothing changed: send the same request again when the shards are back"
	}
}

// Set writes the override of (queue, key) on every shard. The error is
// non-nil only for invalid arguments (an *api.Error, status 400), in which
// case no shard was written; every shard's fate is in the result. Writes
// are idempotent, so a retry after a 207 converges.
func Set(ctx context.Context, shards []Shard, actor, queue, key string, weight float64, opts ...Option) (api.WeightWriteResult, error) {
	if err := validateWeightWrite(actor, queue, key); err != nil {
		return api.WeightWriteResult{}, err
	}
	if err := ValidateWeight(weight); err != nil {
		return api.WeightWriteResult{}, err
	}
	if err := checkShards(shards); err != nil {
		return api.WeightWriteResult{}, err
	}
	o := collect(opts)
	res := call(ctx, shards, o, func(ctx context.Context, db shard.Querier) (Change, error) {
		return SetOne(ctx, db, actor, queue, key, weight)
	})
	out := api.WeightWriteResult{Queue: queue, Key: key, Weight: &weight}
	for _, r := range res {
		out.Shards = append(out.Shards, outcomeOf(r.Shard, r.Err))
	}
	out.Message = writeMessage("set", out.Shards)
	out.PublishErr = o.publish(ctx, out.Shards, queue, key, "weight")
	return out, nil
}

// Clear removes the override of (queue, key) on every shard; the answer
// follows the rules of Set (without the cap).
func Clear(ctx context.Context, shards []Shard, actor, queue, key string, opts ...Option) (api.WeightWriteResult, error) {
	if err := validateWeightWrite(actor, queue, key); err != nil {
		return api.WeightWriteResult{}, err
	}
	if err := checkShards(shards); err != nil {
		return api.WeightWriteResult{}, err
	}
	o := collect(opts)
	res := call(ctx, shards, o, func(ctx context.Context, db shard.Querier) (Change, error) {
		return ClearOne(ctx, db, actor, queue, key)
	})
	out := api.WeightWriteResult{Queue: queue, Key: key}
	for _, r := range res {
		out.Shards = append(out.Shards, outcomeOf(r.Shard, r.Err))
	}
	out.Message = writeMessage("cleared", out.Shards)
	out.PublishErr = o.publish(ctx, out.Shards, queue, key, "weight")
	return out, nil
}

func checkShards(shards []Shard) error {
	if len(shards) == 0 {
		return api.NewError(api.CodeInternal, "no shards configured")
	}
	return nil
}

func (o options) publish(ctx context.Context, shards []api.ShardOutcome, queue, key, kind string) error {
	if o.nc == nil {
		return nil
	}
	for _, s := range shards {
		if s.Outcome == api.ShardOutcomeOK {
			return dispatch.Publish(ctx, o.nc, o.subjects.Weights(queue),
				dispatch.WeightEvent{Queue: queue, Key: key, Kind: kind})
		}
	}
	return nil
}

// Get reads the overrides of queue from every shard and compares them.
func Get(ctx context.Context, shards []Shard, queue string, opts ...Option) (api.WeightReadResult, error) {
	if err := ValidateQueue(queue); err != nil {
		return api.WeightReadResult{}, err
	}
	if err := checkShards(shards); err != nil {
		return api.WeightReadResult{}, err
	}
	o := collect(opts)
	res := call(ctx, shards, o, func(ctx context.Context, db shard.Querier) ([]api.WeightOverride, error) {
		all, err := List(ctx, db, queue)
		return ownedOnly(all, err, o.owner, func(ov api.WeightOverride) string { return ov.Key })
	})
	out := api.WeightReadResult{Queue: queue, Overrides: []api.WeightOverride{}, WeightsUniform: true, UnavailableShards: routing.Unavailable(res)}
	// Every key any answering shard holds, with each shard's weight.
	per := map[string]map[int]float64{}
	var answered []int
	detail := make([]api.ShardWeights, len(res))
	for i, r := range res {
		so := outcomeOf(r.Shard, r.Err)
		detail[i] = api.ShardWeights{Shard: r.Shard, Outcome: so.Outcome, Message: so.Message, Differing: []api.KeyWeight{}}
		if r.Err != nil {
			continue
		}
		answered = append(answered, i)
		detail[i].Overrides = len(r.Value)
		for _, ov := range r.Value {
			if per[ov.Key] == nil {
				per[ov.Key] = map[int]float64{}
			}
			per[ov.Key][i] = ov.Weight
		}
	}
	keys := make([]string, 0, len(per))
	for k := range per {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ws := per[k]
		first, agree := 0.0, len(ws) == len(answered)
		for j, i := range answered {
			w, ok := ws[i]
			if j == 0 {
				first = w
			}
			if !ok || w != first {
				agree = false
			}
		}
		if agree {
			out.Overrides = append(out.Overrides, api.WeightOverride{Key: k, Weight: first})
			continue
		}
		out.WeightsUniform = false
		for _, i := range answered {
			kw := api.KeyWeight{Key: k}
			if w, ok := ws[i]; ok {
				kw.Weight = &w
			}
			detail[i].Differing = append(detail[i].Differing, kw)
		}
	}
	if !out.WeightsUniform || len(out.UnavailableShards) > 0 {
		out.Shards = detail
	}
	switch {
	case len(answered) == 0:
		out.Message = "no shard answered"
	case !out.WeightsUniform:
		out.Message = "the shards disagree; overrides lists what they agree on, shards shows the rest: set or clear the keys in dispute again to bring every shard to the same weight"
	case len(out.UnavailableShards) > 0:
		out.Message = fmt.Sprintf("shard %s did not answer; the other shards agree", joinInts(out.UnavailableShards))
	}
	return out, nil
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ", ")
}
