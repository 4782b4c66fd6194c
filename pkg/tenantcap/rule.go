package tenantcap

import (
	"context"
	"time"

	"github.com/harvest-run/harvest/pkg/api"
)

// ReasonLease is not a refusal a caller sees: Rule.Judge's word for a
// start that only the shard's capacity lease refuses, which more capacity
// (Leases.Acquire) would admit. The start statement says it as 'lease'.
const ReasonLease Reason = "lease"

// ReasonUnavailable refuses every new run while there is no rule to judge
// by (a gateway that could not read the configuration yet); the caller
// answers it with the error its Ruler gave.
const ReasonUnavailable Reason = "unavailable"

// Rule is the admission rule of one shard at one moment: every figure a
// decision needs except the counts that the start statement reads under
// its locks. The gateway builds one per start group (Admitter.Rule) and
// the statement decides each new run of the group by it
// (harvest_admission_decide, with the figures of Params), so that
// admission takes no round trip to Go while the shard's locks are held.
// Judge is the same decision in Go: Admitter.Check judges by it, and a
// property test requires both to agree.
type Rule struct {
	Config  Config
	MaxRuns int
	// Tenants is the number of registered tenants.
	Tenants int
	// Others is the other shards' unfinished runs, as cached (Totals).
	Others int
	// Leased says the shard's capacity lease bounds its unfinished runs
	// (the Admitter has Leases).
	Leased bool
	// RetryAfter is the hint of a refusal.
	RetryAfter time.Duration
}

// ScheduledCap is the most runs not due yet a tenant may hold under the
// rule (see ScheduledCap).
func (r Rule) ScheduledCap() int { return ScheduledCap(r.Config, r.MaxRuns, r.Tenants) }

// Judge decides one new run of tenant from the counts before it: local is
// the shard's unfinished runs, own the tenant's, lease the shard's
// capacity lease, scheduled the tenant's runs not due yet including this
// one when this one is not due (0 when it is). It is Admitter.Check
// without taking capacity: when only the lease refuses the run (the
// cached totals would admit it), more is true and d is the refusal the
// lease gives; with more capacity Judge would admit it.
func (r Rule) Judge(tenant string, local, own, lease, scheduled int) (d Decision, more bool) {
	if scheduled > 0 {
		if limit := r.ScheduledCap(); scheduled > limit {
			return Decision{Reason: ReasonScheduled, Algorithm: r.Config.Algorithm, TFM: r.Config.TFM,
				MaxRuns: r.MaxRuns, Tenants: r.Tenants, Own: own, Tenant: tenant, RetryAfter: r.RetryAfter,
				Scheduled: scheduled, ScheduledCap: limit}, false
		}
	}
	if !r.Leased {
		return r.decide(tenant, local, own, -1), false
	}
	d = r.decide(tenant, local, own, lease)
	if d.Admit {
		return d, false
	}
	// The lease's bound on the other shards makes the total look larger
	// than it is; a refusal says what the system holds by the cached
	// totals when they refuse too (a tenant at its limit, a full system).
	if dv := r.decide(tenant, local, own, -1); !dv.Admit {
		return dv, false
	}
	return d, true
}

// decide applies the rule to this shard's exact counts and the other
// shards' unfinished runs: their cached totals, and with a lease (lease >=
// 0) at least what the lease leaves of max_runs, which the others cannot
// exceed however they interleave. (The cached totals still count when
// they are higher: after max_runs is lowered, shards may hold more than
// it until they give capacity back.)
func (r Rule) decide(tenant string, local, own, lease int) Decision {
	others := r.Others
	if lease >= 0 {
		others = max(others, r.MaxRuns-lease)
	}
	d := Decide(r.Config, r.MaxRuns, r.Tenants, local+others, own)
	d.Tenant = tenant
	if !d.Admit {
		d.RetryAfter = r.RetryAfter
	}
	return d
}

// LeaseNeeded is the smallest lease with which a start would be admitted,
// or 0 when no lease would do (a tenant at its Static limit). The decision
// only improves as the lease grows: a larger lease admits more runs on the
// shard and, under Dynamic, bounds the other shards' runs lower, which
// raises the tenant's limit.
func (r Rule) LeaseNeeded(local, own int) int {
	admits := func(lease int) bool { return r.decide("", local, own, lease).Admit }
	lo, hi := local+1, max(r.MaxRuns, local+1)
	if !admits(hi) {
		return 0
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		if admits(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// RuleParams are a Rule's figures as the start statement takes them
// (harvest_start_group, harvest_admission_decide).
type RuleParams struct {
	// Algorithm is the algorithm's API name.
	Algorithm string
	// TFM is the multiplier; only Dynamic reads it.
	TFM     float64
	MaxRuns int64
	// StaticLimit is Static's per-tenant limit, which does not depend on
	// the total (0 under the other algorithms).
	StaticLimit int64
	Others      int64
	Leased      bool
	// ScheduledCap bounds the runs not due yet a tenant may hold.
	ScheduledCap int64
}

// maxStatementTFM bounds the multiplier handed to the statement, whose
// float arithmetic fails on an overflow where Go's gives +Inf. Above it
// every Dynamic limit with any spare capacity is maxLimit anyway (1e12
// times at least one run), so the bound changes no decision.
const maxStatementTFM = 1e12

// Params returns the rule's figures for the start statement. Everything
// that depends only on the configuration is computed here, by the same
// functions Judge uses; what the statement computes itself is the
// Dynamic limit, which depends on the total it reads.
func (r Rule) Params() RuleParams {
	p := RuleParams{
		Algorithm:    string(r.Config.Algorithm),
		TFM:          min(r.Config.TFM, maxStatementTFM),
		MaxRuns:      int64(r.MaxRuns),
		Others:       int64(r.Others),
		Leased:       r.Leased,
		ScheduledCap: int64(r.ScheduledCap()),
	}
	if r.Config.Algorithm == api.AlgorithmStatic {
		limit, _ := Limit(r.Config, r.MaxRuns, r.Tenants, 0)
		p.StaticLimit = int64(limit)
	}
	return p
}

// Ruler is a Hook whose decisions a start statement can make itself: a
// start group asks it for the Rule once and the statement judges every
// new run of the group by it, under the shard's locks, with no round trip
// to Go. The Admitter of this package is one; a Hook that is not a Ruler
// is asked about each new run in Go, with a round trip more.
type Ruler interface {
	Hook
	// Rule is the rule new runs on shard are judged by now. An error
	// refuses every new run of the group with it (a replay is still
	// answered): an *api.Error reaches the caller as it is.
	Rule(shard int) (Rule, error)
	// Acquire takes capacity from the ledger for shard until its lease is
	// at least need, grown by the runs the shard admitted since its count
	// was seen (Leases.Acquire), and returns the lease then. The committer
	// calls it for the starts the statement refused as 'lease', outside
	// any transaction, and sends them again.
	Acquire(ctx context.Context, shard, seen, need int) (int, error)
	// Decided reports the decisions of a start group once it committed:
	// how many new runs were admitted and the refusals (for metrics).
	Decided(admitted int, refused []Decision)
}
