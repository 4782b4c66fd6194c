package weights

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/pgrow"
	"github.com/harvest-run/harvest/internal/sqlfile"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/fairkeys"
	"github.com/harvest-run/harvest/pkg/shard"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

var (
	sqlWeightSetOne   = sqlfile.Must(sqlFiles, "WeightSetOne")
	sqlWeightClearOne = sqlfile.Must(sqlFiles, "WeightClearOne")
	sqlWeightList     = sqlfile.Must(sqlFiles, "WeightList")
	sqlWeightQueues   = sqlfile.Must(sqlFiles, "WeightQueues")
	sqlQuotaSetOne    = sqlfile.Must(sqlFiles, "QuotaSetOne")
	sqlQuotaClearOne  = sqlfile.Must(sqlFiles, "QuotaClearOne")
	sqlQuotaList      = sqlfile.Must(sqlFiles, "QuotaList")
	sqlKeyList        = sqlfile.Must(sqlFiles, "KeyList")
	sqlAuditList      = sqlfile.Must(sqlFiles, "AuditList")
	sqlAuditRefused   = sqlfile.Must(sqlFiles, "AuditRefused")
)

// Audit actions and outcomes written by this package.
const (
	ActionWeightSet    = "weight.set"
	ActionWeightClear  = "weight.clear"
	ActionQuotaSet     = "quota.set"
	ActionQuotaClear   = "quota.clear"
	AuditOutcomeOK     = "ok"
	AuditOutcomeRefuse = "refused"
)

// Change is what one shard did with a weight write.
type Change struct {
	// Outcome is api.ShardOutcomeOK or api.ShardOutcomeCapReached.
	Outcome string `db:"outcome"`
	// Old is the override before the write (nil: there was none).
	Old *float64 `db:"old_weight"`
	// Overrides is how many overrides the queue holds on the shard after
	// the write.
	Overrides int `db:"overrides"`
}

// SetOne sets the override of (queue, key) to weight on the shard of db
// and writes its audit row in the same statement. A set to the weight the
// key already has succeeds (and is audited as unchanged), so a write can
// always be sent again. A new key on a queue that already holds
// MaxOverrides overrides is refused: the refusal's audit row is written and
// the error wraps ErrCapReached. Invalid arguments give an *api.Error.
func SetOne(ctx context.Context, db shard.Querier, actor, queue, key string, weight float64) (Change, error) {
	if err := validateWeightWrite(actor, queue, key); err != nil {
		return Change{}, err
	}
	if err := ValidateWeight(weight); err != nil {
		return Change{}, err
	}
	c, err := pgrow.One[Change](ctx, db, sqlWeightSetOne, queue, key, weight, actor)
	if err != nil {
		return Change{}, mapError("set weight", err)
	}
	if c.Outcome == api.ShardOutcomeCapReached {
		return c, fmt.Errorf("weights: set weight: %w: queue %q holds %d overrides, the most allowed; clear one first",
			ErrCapReached, queue, c.Overrides)
	}
	return c, nil
}

// ClearOne removes the override of (queue, key) on the shard of db, so the
// key weighs 1 from its next charge, and writes the audit row in the same
// statement. Clearing a key that has no override succeeds (Old is nil).
func ClearOne(ctx context.Context, db shard.Querier, actor, queue, key string) (Change, error) {
	if err := validateWeightWrite(actor, queue, key); err != nil {
		return Change{}, err
	}
	c, err := pgrow.One[Change](ctx, db, sqlWeightClearOne, queue, key, actor)
	return c, mapError("clear weight", err)
}

func validateWeightWrite(actor, queue, key string) error {
	if err := validateActor(actor); err != nil {
		return err
	}
	if err := ValidateQueue(queue); err != nil {
		return err
	}
	return ValidateOverrideKey(key)
}

// Queues lists the queues that hold weight overrides on the shard of db,
// in name order, at most limit of them.
func Queues(ctx context.Context, db shard.Querier, limit int) ([]string, error) {
	rows, err := db.Query(ctx, sqlWeightQueues, limit)
	if err != nil {
		return nil, fmt.Errorf("weights: list queues: %w", err)
	}
	qs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("weights: list queues: %w", err)
	}
	return qs, nil
}

// List returns the overrides of queue on the shard of db, by key in byte
// order. Keys without a row weigh 1.
func List(ctx context.Context, db shard.Querier, queue string) ([]api.WeightOverride, error) {
	if err := ValidateQueue(queue); err != nil {
		return nil, err
	}
	got, err := pgrow.All[overrideRow](ctx, db, sqlWeightList, queue)
	if err != nil {
		return nil, mapError("list weights", err)
	}
	out := make([]api.WeightOverride, len(got))
	for i, r := range got {
		out[i] = api.WeightOverride{Key: r.Key, Weight: r.Weight, UpdatedAt: r.UpdatedAt, UpdatedBy: r.UpdatedBy}
	}
	return out, nil
}

// QuotaChange is what one shard did with a quota write.
type QuotaChange struct {
	Outcome string     // api.ShardOutcomeOK
	Old     *api.Quota // the quota before the write (nil: there was none)
}

// SetQuotaOne replaces the quota of (queue, quotaKey) on the shard of db
// and writes the audit row in the same statement. The claim's rechecks read
// it at their next claim of the quota key.
func SetQuotaOne(ctx context.Context, db shard.Querier, actor, queue, quotaKey string, q api.Quota) (QuotaChange, error) {
	if err := validateQuotaWrite(actor, queue, quotaKey); err != nil {
		return QuotaChange{}, err
	}
	if err := q.Validate(); err != nil {
		return QuotaChange{}, err
	}
	var mc *int32
	if q.MaxConcurrent != nil {
		v := int32(*q.MaxConcurrent)
		mc = &v
	}
	c, err := quotaChange(ctx, db, sqlQuotaSetOne, queue, quotaKey, mc, q.Rate, q.Burst, actor)
	return c, mapError("set quota", err)
}

// ClearQuotaOne removes the quota of (queue, quotaKey) and its rate bucket
// on the shard of db, with its audit row. Clearing a missing quota succeeds.
func ClearQuotaOne(ctx context.Context, db shard.Querier, actor, queue, quotaKey string) (QuotaChange, error) {
	if err := validateQuotaWrite(actor, queue, quotaKey); err != nil {
		return QuotaChange{}, err
	}
	c, err := quotaChange(ctx, db, sqlQuotaClearOne, queue, quotaKey, actor)
	return c, mapError("clear quota", err)
}

func validateQuotaWrite(actor, queue, quotaKey string) error {
	if err := validateActor(actor); err != nil {
		return err
	}
	if err := ValidateQueue(queue); err != nil {
		return err
	}
	return ValidateQuotaKey(quotaKey)
}

// quotaChange runs a quota write (QuotaSetOne, QuotaClearOne) and reads
// its answer.
func quotaChange(ctx context.Context, db shard.Querier, sql string, args ...any) (QuotaChange, error) {
	r, err := pgrow.One[quotaChangeRow](ctx, db, sql, args...)
	if err != nil {
		return QuotaChange{}, err
	}
	c := QuotaChange{Outcome: r.Outcome}
	if len(r.Old) > 0 && string(r.Old) != "null" {
		c.Old = new(api.Quota)
		if err := json.Unmarshal(r.Old, c.Old); err != nil {
			return QuotaChange{}, fmt.Errorf("decode old quota: %w", err)
		}
	}
	return c, nil
}

// ListQuotas returns the quotas of queue on the shard of db (only that of
// quotaKey when it is not empty), by quota key in byte order.
func ListQuotas(ctx context.Context, db shard.Querier, queue, quotaKey string) ([]api.QuotaEntry, error) {
	if err := ValidateQueue(queue); err != nil {
		return nil, err
	}
	var qk any
	if quotaKey != "" {
		if err := ValidateQuotaKey(quotaKey); err != nil {
			return nil, err
		}
		qk = quotaKey
	}
	got, err := pgrow.All[quotaRow](ctx, db, sqlQuotaList, queue, qk)
	if err != nil {
		return nil, mapError("list quotas", err)
	}
	out := make([]api.QuotaEntry, len(got))
	for i, r := range got {
		out[i] = api.QuotaEntry{QuotaKey: r.QuotaKey,
			Quota:     api.Quota{MaxConcurrent: r.MaxConcurrent, Rate: r.Rate, Burst: r.Burst},
			UpdatedAt: r.UpdatedAt, UpdatedBy: r.UpdatedBy}
	}
	return out, nil
}

// DefaultKeyLimit and MaxKeyLimit bound the keys listed per shard.
const (
	DefaultKeyLimit = 1000
	MaxKeyLimit     = 10000
)

// KeysOne lists the keys of queue on the shard of db: every key with
// fairness state, due pending work, an override or a claim in the last
// minute, at most limit of them (DefaultKeyLimit when limit <= 0).
func KeysOne(ctx context.Context, db shard.Querier, queue string, limit int) (api.ShardKeyList, error) {
	return keysOne(ctx, db, queue, "", limit)
}

// keysOne is KeysOne limited to the keys bound to owner (all when "").
func keysOne(ctx context.Context, db shard.Querier, queue, owner string, limit int) (api.ShardKeyList, error) {
	if err := ValidateQueue(queue); err != nil {
		return api.ShardKeyList{}, err
	}
	if limit <= 0 {
		limit = DefaultKeyLimit
	}
	if limit > MaxKeyLimit {
		return api.ShardKeyList{}, api.Invalid("limit", "limit must be at most %d", MaxKeyLimit)
	}
	// The database clock decides the window, as it sets claimed_at.
	var own any
	if owner != "" {
		own = owner
	}
	got, err := pgrow.All[keyRow](ctx, db, sqlKeyList, queue, nil, limit+1, own)
	if err != nil {
		return api.ShardKeyList{}, mapError("list keys", err)
	}
	out := api.ShardKeyList{Keys: []api.KeyView{}}
	for _, r := range got {
		out.Clock = r.Clock
		k := api.KeyView{Key: r.Key, Pass: r.Pass, Lag: r.Lag, Pending: r.Pending, ClaimsLastMinute: r.Claims}
		k.Weight = fairkeys.EffectiveWeight(k.Key, deref(r.Weight), r.Weight != nil)
		k.Overridden = r.Weight != nil && k.Key != fairkeys.DefaultKey
		if r.ChargedAt != nil {
			k.ChargedAt = &api.Time{Time: *r.ChargedAt}
		}
		out.Keys = append(out.Keys, k)
	}
	if len(out.Keys) > limit {
		out.Keys = out.Keys[:limit]
		out.Truncated = true
	}
	if out.Paused, err = PausedOne(ctx, db, queue); err != nil {
		return api.ShardKeyList{}, err
	}
	return out, nil
}

func deref(p *float64) float64 {
	if p == nil {
		return 0
	}
	return *p
}

// Audit page sizes.
const (
	DefaultAuditLimit = 100
	MaxAuditLimit     = 1000
)

// AuditList returns the audit rows of the shard of db, newest first:
// limit rows (DefaultAuditLimit when limit <= 0) after cursor, which is ""
// for the first page or the NextCursor of the page before. A cursor that
// this function did not make gives an *api.Error naming "cursor".
func AuditList(ctx context.Context, db shard.Querier, cursor string, limit int) (api.AuditPage, error) {
	if limit <= 0 {
		limit = DefaultAuditLimit
	}
	if limit > MaxAuditLimit {
		return api.AuditPage{}, api.Invalid("limit", "limit must be at most %d", MaxAuditLimit)
	}
	var before any
	if cursor != "" {
		id, err := strconv.ParseInt(cursor, 10, 64)
		if err != nil || id <= 0 {
			return api.AuditPage{}, api.Invalid("cursor", "cursor is not one this server gave out")
		}
		before = id
	}
	got, err := pgrow.All[auditRow](ctx, db, sqlAuditList, before, limit+1)
	if err != nil {
		return api.AuditPage{}, mapError("list audit", err)
	}
	page := api.AuditPage{Entries: make([]api.AuditEntry, len(got))}
	for i, r := range got {
		e := api.AuditEntry{ID: r.ID, At: api.Time{Time: r.At}, Actor: r.Actor, Action: r.Action,
			Queue: r.Queue, Key: r.Key, OldValue: rawOrNull(r.OldValue), NewValue: rawOrNull(r.NewValue),
			Outcome: r.Outcome, Message: r.Message, Repeats: r.Repeats}
		if r.LastAt != nil {
			e.LastAt = &api.Time{Time: *r.LastAt}
		}
		page.Entries[i] = e
	}
	if len(page.Entries) > limit {
		page.Entries = page.Entries[:limit]
		page.NextCursor = strconv.FormatInt(page.Entries[limit-1].ID, 10)
	}
	return page, nil
}

func rawOrNull(b []byte) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	return json.RawMessage(b)
}

// ValidateLimit checks the limit of a per-key listing.
func ValidateLimit(limit int) error {
	if limit > MaxKeyLimit {
		return api.Invalid("limit", "limit must be at most %d", MaxKeyLimit)
	}
	return nil
}
