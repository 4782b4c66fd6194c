package api

import (
	"encoding/json"
	"math"
	"net/http"
	"time"
)

// The bodies of the weight, quota, key and audit routes
// (/v1/queues/{queue}/weights, .../quotas, .../keys, /v1/audit), shared by
// the gateway that writes them and the clients that read them. The writes
// and fan-outs behind them live in pkg/weights.

// Limits of quota settings. They keep the numbers inside what the schema
// stores (max_concurrent is a 32-bit integer) and away from values that
// only a typo would produce.
const (
	QuotaMaxConcurrent = 1_000_000
	QuotaMaxRate       = 1_000_000.0
	QuotaMaxBurst      = 1_000_000.0
)

// ShardOutcome is one shard's part of a write: the wire form of one
// shard's answer to a call made on every shard (the servers' and the CLI's
// fan-out; pkg/weights turns a shard's error into its Outcome), embedded
// by the per-shard parts of the pause, fairness and group weight answers.
type ShardOutcome struct {
	Shard int `json:"shard"`
	// Outcome is ShardOutcomeOK, ShardOutcomeUnavailable,
	// ShardOutcomeCapReached or ShardOutcomeError.
	Outcome string `json:"outcome"`
	Message string `json:"message"`
}

// writeStatus is the HTTP status of a write from its shard outcomes: 409
// when any shard refused at the cap, else 200 when every shard took it,
// 207 when some did, 503 when none did.
func writeStatus(shards []ShardOutcome) int {
	ok, capped := 0, 0
	for _, s := range shards {
		switch s.Outcome {
		case ShardOutcomeOK:
			ok++
		case ShardOutcomeCapReached:
			capped++
		}
	}
	switch {
	case capped > 0:
		return http.StatusConflict
	case ok == len(shards) && ok > 0:
		return http.StatusOK
	case ok > 0:
		return http.StatusMultiStatus
	default:
		return http.StatusServiceUnavailable
	}
}

// WeightWriteResult is the answer to PUT and DELETE
// /v1/queues/{queue}/weights/{key}; Status gives its HTTP status.
type WeightWriteResult struct {
	Queue string `json:"queue"`
	Key   string `json:"key"`
	// Weight is the weight written; null for a clear (the key weighs 1).
	Weight  *float64       `json:"weight"`
	Shards  []ShardOutcome `json:"shards"`
	Message string         `json:"message"`
	// PublishErr is why the change event was not sent, for the log; the
	// write itself stands.
	PublishErr error `json:"-"`
}

// Status is 200 (every shard took it), 207 (some did: send it again), 409
// (some shard refused at the cap, whatever the others did) or 503 (none
// did).
func (r WeightWriteResult) Status() int { return writeStatus(r.Shards) }

// KeyWeight is one key's weight on one shard; a nil Weight means the
// shard holds no override for the key (it weighs 1 there).
type KeyWeight struct {
	Key    string   `json:"key"`
	Weight *float64 `json:"weight"`
}

// ShardWeights is one shard's detail in a weights read that is not
// uniform or not complete.
type ShardWeights struct {
	Shard int `json:"shard"`
	// Outcome is ShardOutcomeOK, ShardOutcomeUnavailable or ShardOutcomeError.
	Outcome string `json:"outcome"`
	Message string `json:"message,omitempty"`
	// Overrides is how many overrides the shard holds for the queue.
	Overrides int `json:"overrides"`
	// Differing lists the keys on which the answering shards disagree,
	// with this shard's weight for each.
	Differing []KeyWeight `json:"differing"`
}

// WeightReadResult is the answer to GET /v1/queues/{queue}/weights.
type WeightReadResult struct {
	Queue string `json:"queue"`
	// Overrides are the overrides on which every answering shard agrees.
	Overrides []WeightOverride `json:"overrides"`
	// WeightsUniform is false when the answering shards disagree; Shards
	// then shows what each holds for the keys in dispute.
	WeightsUniform    bool  `json:"weights_uniform"`
	UnavailableShards []int `json:"unavailable_shards"`
	// Shards is present when the shards disagree or some did not answer.
	Shards  []ShardWeights `json:"shards,omitempty"`
	Message string         `json:"message,omitempty"`
}

// Status is 200 when at least one shard answered, else 503.
func (r WeightReadResult) Status() int {
	if len(r.UnavailableShards) == len(r.Shards) && len(r.Shards) > 0 {
		return http.StatusServiceUnavailable
	}
	return http.StatusOK
}

// Outcomes of a write on one shard, as they appear in the shards list of
// a write's answer.
const (
	ShardOutcomeOK          = "ok"
	ShardOutcomeUnavailable = "unavailable"
	ShardOutcomeCapReached  = "cap_reached"
	ShardOutcomeError       = "error"
)

// WeightOverride is one weight override.
type WeightOverride struct {
	Key    string  `json:"key"`
	Weight float64 `json:"weight"`
	// UpdatedAt and UpdatedBy say who wrote the override last (not part of
	// the weights resource; shown by the CLI).
	UpdatedAt time.Time `json:"-"`
	UpdatedBy string    `json:"-"`
}

// QuotaEntry is the quota of one quota key.
type QuotaEntry struct {
	QuotaKey string `json:"quota_key"`
	Quota
	UpdatedAt time.Time `json:"-"`
	UpdatedBy string    `json:"-"`
}

// KeyView is one key of a queue on one shard, as GET /v1/queues/{q}/keys
// shows it.
type KeyView struct {
	Key string `json:"key"`
	// Weight is the weight the key's next charge uses; Overridden says
	// whether an override sets it.
	Weight     float64 `json:"weight"`
	Overridden bool    `json:"overridden"`
	// Pass is the key's virtual finish time (null before its first fair
	// claim, or after its state was pruned).
	Pass *float64 `json:"pass"`
	// Lag is how far the key's next start is ahead of the queue clock:
	// max(pass, V) - V. The fair claim serves the smallest lag first; 0
	// means the key is not in debt.
	Lag float64 `json:"lag"`
	// Pending counts the key's due pending tasks.
	Pending int `json:"pending"`
	// ClaimsLastMinute counts the key's tasks claimed in the last minute
	// (by their latest claim; fair and ordinary claims alike).
	ClaimsLastMinute int `json:"claims_last_minute"`
	// ChargedAt is the time of the key's last fair charge.
	ChargedAt *Time `json:"charged_at"`
}

// ShardKeyList is the per-key view of a queue on one shard.
type ShardKeyList struct {
	// Clock is the queue clock V: the largest last_start of the queue.
	Clock float64   `json:"clock"`
	Keys  []KeyView `json:"keys"`
	// Truncated: the queue has more keys than the limit; the first ones in
	// byte order are listed.
	Truncated bool `json:"truncated"`
	// Paused is set while the queue is paused on the shard: its workers
	// claim none of its tasks there until it is resumed.
	Paused *QueuePause `json:"paused"`
}

// AuditEntry is one audit row.
type AuditEntry struct {
	ID     int64   `json:"id"`
	At     Time    `json:"at"`
	Actor  string  `json:"actor"`
	Action string  `json:"action"`
	Queue  *string `json:"queue"`
	Key    *string `json:"key"`
	// OldValue and NewValue are the setting before and after (null: none),
	// e.g. {"weight": 2} or {"max_concurrent": 5, "rate": null, "burst": null}.
	OldValue json.RawMessage `json:"old_value"`
	NewValue json.RawMessage `json:"new_value"`
	// Outcome is "ok" or "refused"; Message says why a change was refused,
	// or notes a change that changed nothing.
	Outcome string `json:"outcome"`
	Message string `json:"message"`
	// Repeats counts the further refused attempts of the same actor,
	// action and status folded into this row (see weights.AuditRefused);
	// LastAt is when the latest of them came (absent on other rows).
	Repeats int   `json:"repeats"`
	LastAt  *Time `json:"last_at,omitempty"`
}

// AuditPage is one page of GET /v1/audit.
type AuditPage struct {
	Entries []AuditEntry `json:"entries"`
	// NextCursor fetches the next (older) page; empty on the last page.
	NextCursor string `json:"next_cursor"`
}

// QuotaWriteResult is the answer to PUT and DELETE
// /v1/queues/{queue}/quotas/{quota_key}; Status gives its HTTP status
// (200, 207 or 503, as for weights; quotas have no cap).
type QuotaWriteResult struct {
	Queue    string `json:"queue"`
	QuotaKey string `json:"quota_key"`
	// The settings written (all null for a clear).
	Quota
	Shards     []ShardOutcome `json:"shards"`
	Message    string         `json:"message"`
	PublishErr error          `json:"-"`
}

// Status is 200, 207 or 503 by the rules of WeightWriteResult.Status.
func (r QuotaWriteResult) Status() int { return writeStatus(r.Shards) }

// ShardQuotas is one shard's detail in a quota read that is not uniform
// or not complete.
type ShardQuotas struct {
	Shard   int          `json:"shard"`
	Outcome string       `json:"outcome"`
	Message string       `json:"message,omitempty"`
	Quotas  []QuotaEntry `json:"quotas"`
}

// QuotaReadResult is the answer to GET /v1/queues/{queue}/quotas/{key}
// (one quota key) and of the CLI's listing of a queue's quotas.
type QuotaReadResult struct {
	Queue string `json:"queue"`
	// Quotas are the quotas on which every answering shard agrees; a quota
	// key without an entry has no limits.
	Quotas            []QuotaEntry `json:"quotas"`
	QuotasUniform     bool         `json:"quotas_uniform"`
	UnavailableShards []int        `json:"unavailable_shards"`
	// Shards is present when the shards disagree or some did not answer;
	// each lists the quotas in dispute as that shard holds them.
	Shards  []ShardQuotas `json:"shards,omitempty"`
	Message string        `json:"message,omitempty"`
}

// Status is 200 when at least one shard answered, else 503.
func (r QuotaReadResult) Status() int {
	if len(r.UnavailableShards) == len(r.Shards) && len(r.Shards) > 0 {
		return http.StatusServiceUnavailable
	}
	return http.StatusOK
}

// ShardKeys is one shard's part of the per-key view.
type ShardKeys struct {
	Shard   int    `json:"shard"`
	Outcome string `json:"outcome"`
	Message string `json:"message,omitempty"`
	ShardKeyList
}

// KeysResult is the answer to GET /v1/queues/{queue}/keys.
type KeysResult struct {
	Queue             string      `json:"queue"`
	Shards            []ShardKeys `json:"shards"`
	UnavailableShards []int       `json:"unavailable_shards"`
	// PausedShards lists the shards where the queue is paused (see
	// POST /v1/queues/{queue}/pause): no worker claims from it there.
	PausedShards []int `json:"paused_shards"`
}

// Status is 200 when at least one shard answered, else 503.
func (r KeysResult) Status() int {
	if len(r.UnavailableShards) == len(r.Shards) {
		return http.StatusServiceUnavailable
	}
	return http.StatusOK
}

// Quota is the post-claim rechecks of one (queue, quota key): a concurrency
// cap (tasks of the quota key running at once) and a token-bucket rate
// limit (rate claims per second, bursts of up to burst claims). A nil field
// means no such limit. A write replaces all three fields at once.
type Quota struct {
	MaxConcurrent *int     `json:"max_concurrent"`
	Rate          *float64 `json:"rate"`
	Burst         *float64 `json:"burst"`
}

// Validate checks the settings; the error names the field at fault.
func (q Quota) Validate() error {
	if q.MaxConcurrent == nil && q.Rate == nil && q.Burst == nil {
		return Invalid("max_concurrent", "set max_concurrent, or rate and burst, or both; to remove a quota, clear it")
	}
	if q.MaxConcurrent != nil && (*q.MaxConcurrent < 1 || *q.MaxConcurrent > QuotaMaxConcurrent) {
		return Invalid("max_concurrent", "max_concurrent must be from 1 to %d", QuotaMaxConcurrent)
	}
	if (q.Rate == nil) != (q.Burst == nil) {
		if q.Rate == nil {
			return Invalid("rate", "rate is required with burst")
		}
		return Invalid("burst", "burst is required with rate")
	}
	if q.Rate != nil {
		if r := *q.Rate; math.IsNaN(r) || math.IsInf(r, 0) || r <= 0 || r > QuotaMaxRate {
			return Invalid("rate", "rate must be a finite number of claims per second above 0 and at most %g", QuotaMaxRate)
		}
		if b := *q.Burst; math.IsNaN(b) || math.IsInf(b, 0) || b < 1 || b > QuotaMaxBurst {
			return Invalid("burst", "burst must be a finite number from 1 to %g", QuotaMaxBurst)
		}
	}
	return nil
}

// WeightBody is the body of PUT /v1/queues/{queue}/weights/{key}.
type WeightBody struct {
	Weight *float64 `json:"weight"`
}
