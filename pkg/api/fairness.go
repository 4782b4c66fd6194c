package api

// Values of QueueFairness.Charge.
const (
	// ChargeClaims bills each claim 1/w: keys share the claims.
	ChargeClaims = "claims"
	// ChargeRuntime bills a key the seconds its tasks hold a worker over
	// its weight: keys share the worker time.
	ChargeRuntime = "runtime"
)

// QueueFairness is a queue's fairness modes on one shard. A queue never
// configured is one-level and charged per claim.
type QueueFairness struct {
	// TwoLevel shares the queue among groups (the tenant part of a key,
	// before its first "/") by their weights first, then among each
	// group's keys by theirs.
	TwoLevel bool `json:"two_level"`
	// Charge is ChargeClaims or ChargeRuntime.
	Charge string `json:"charge"`
	// UpdatedAt and UpdatedBy are the last change; absent for a queue
	// never configured.
	UpdatedAt *Time  `json:"updated_at,omitempty"`
	UpdatedBy string `json:"updated_by,omitempty"`
	// GroupWeights are the groups given a weight other than 1, by name;
	// filled by a read (GET), absent from the answer to a change.
	GroupWeights []GroupWeight `json:"group_weights,omitempty"`
}

// GroupWeight is the weight set for one group of a two-level queue.
type GroupWeight struct {
	Group  string  `json:"group"`
	Weight float64 `json:"weight"`
}

// QueueFairnessRequest is the body of PUT /v1/queues/{queue}/fairness: a
// field left out keeps its current value on each shard.
type QueueFairnessRequest struct {
	TwoLevel *bool   `json:"two_level,omitempty"`
	Charge   *string `json:"charge,omitempty"`
}

// QueueFairnessShard is one shard's part of a fairness read or change.
type QueueFairnessShard struct {
	ShardOutcome
	// Fairness is the shard's modes after the call (zero when the shard
	// did not answer).
	Fairness QueueFairness `json:"fairness"`
	// Changed is false when the shard already had the modes asked for
	// (always false for a read).
	Changed bool `json:"changed"`
}

// QueueFairnessResult answers GET and PUT /v1/queues/{queue}/fairness.
type QueueFairnessResult struct {
	Queue  string               `json:"queue"`
	Shards []QueueFairnessShard `json:"shards"`
	// UnavailableShards did not answer: for a write, send it again (it is
	// idempotent).
	UnavailableShards []int `json:"unavailable_shards"`
}

// Status is 200 when every shard answered, 207 when some did, 503 when
// none did.
func (r QueueFairnessResult) Status() int {
	outs := make([]ShardOutcome, len(r.Shards))
	for i, s := range r.Shards {
		outs[i] = s.ShardOutcome
	}
	return writeStatus(outs)
}

// GroupWeightShard is one shard's part of a group weight change.
type GroupWeightShard struct {
	ShardOutcome
	// OldWeight is the group's weight before the change; nil when it had
	// none (it weighed 1).
	OldWeight *float64 `json:"old_weight"`
}

// GroupWeightResult answers PUT and DELETE
// /v1/queues/{queue}/group-weights/{group}.
type GroupWeightResult struct {
	Queue string `json:"queue"`
	Group string `json:"group"`
	// Weight is what was set; nil for a clear.
	Weight            *float64           `json:"weight"`
	Shards            []GroupWeightShard `json:"shards"`
	UnavailableShards []int              `json:"unavailable_shards"`
}

// Status is 200 when every shard took the change, 207 when some did, 503
// when none did.
func (r GroupWeightResult) Status() int {
	outs := make([]ShardOutcome, len(r.Shards))
	for i, s := range r.Shards {
		outs[i] = s.ShardOutcome
	}
	return writeStatus(outs)
}
