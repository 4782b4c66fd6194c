package tenantcap

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/harvest-run/harvest/pkg/api"
)

// Algorithms lists the algorithms in the order a user interface shows them.
func Algorithms() []api.Algorithm {
	return []api.Algorithm{api.AlgorithmNoLimit, api.AlgorithmStatic, api.AlgorithmDynamic}
}

// ParseAlgorithm reads an algorithm's API name; the error lists the known names.
func ParseAlgorithm(s string) (api.Algorithm, error) {
	a := api.Algorithm(s)
	if !a.Valid() {
		return "", fmt.Errorf("unknown algorithm %q (want no_limit, static or dynamic)", s)
	}
	return a, nil
}

// DefaultTFM is the tenant fairness multiplier of a fresh installation.
const DefaultTFM = 1.0

// RecommendedDynamicTFM is a good starting point for the dynamic algorithm.
const RecommendedDynamicTFM = 3.0

// DefaultScheduledShare is the share of a tenant's budget that its runs
// not due yet may hold in a fresh installation (see ScheduledCap).
const DefaultScheduledShare = 0.25

// Config is what an administrator sets: the algorithm, its multiplier and
// the share of a tenant's budget its runs not due yet may take. The JSON
// form is the one stored on shard 0 and carried over NATS.
type Config struct {
	Algorithm api.Algorithm `json:"algorithm"`
	// TFM is the tenant fairness multiplier. It is stored for every
	// algorithm but no_limit ignores it.
	TFM float64 `json:"tfm"`
	// ScheduledShare bounds the runs a tenant holds that are not due yet
	// (started with run_at or delay ahead): see ScheduledCap. Zero, as in
	// a stored configuration from before it existed, means
	// DefaultScheduledShare (Share).
	ScheduledShare float64 `json:"scheduled_share,omitempty"`
}

// Share is the scheduled share in force: ScheduledShare, or
// DefaultScheduledShare when it is zero.
func (c Config) Share() float64 {
	if c.ScheduledShare == 0 {
		return DefaultScheduledShare
	}
	return c.ScheduledShare
}

// DefaultConfig is in force until an administrator changes it: no_limit
// with a TFM of 1, runs not due yet held to DefaultScheduledShare of a
// tenant's budget.
func DefaultConfig() Config { return Config{Algorithm: api.AlgorithmNoLimit, TFM: DefaultTFM} }

// Validate checks every field; the *api.Error names the field at fault.
func (c Config) Validate() error {
	if !c.Algorithm.Valid() {
		return api.Invalid("algorithm", "unknown algorithm %q (want no_limit, static or dynamic)", c.Algorithm)
	}
	if err := ValidateTFM(c.TFM); err != nil {
		return err
	}
	if c.ScheduledShare == 0 {
		return nil
	}
	return ValidateScheduledShare(c.ScheduledShare)
}

// ValidateScheduledShare accepts a share in (0, 1].
func ValidateScheduledShare(v float64) error {
	if math.IsNaN(v) || v <= 0 || v > 1 {
		return api.Invalid("scheduled_share", "scheduled_share must be a number above 0 and at most 1, not %s", formatTFM(v))
	}
	return nil
}

// ScheduledCap is the most runs not due yet (started with run_at or a
// delay still ahead) a tenant may hold under cfg: ScheduledShare of its
// budget, at least one. The budget is its Static limit, or max_runs under
// no_limit and Dynamic (whose limit swings with the load). Such runs count
// as unfinished from their start, as every run does, so without this bound
// a tenant could fill max_runs with runs due in a month and lock every
// other tenant out until then.
func ScheduledCap(cfg Config, maxRuns, tenants int) int {
	budget := maxRuns
	if cfg.Algorithm == api.AlgorithmStatic {
		budget, _ = Limit(cfg, maxRuns, tenants, 0)
	}
	x := cfg.Share() * float64(budget)
	return max(1, clampLimit(math.Floor(x+slack(x))))
}

// MinTFM is the smallest multiplier accepted whatever the system limit:
// below it every limit rounds to zero (the slack that absorbs binary
// rounding is larger than the product).
const MinTFM = 1e-9

// ValidateTFM accepts finite numbers of at least MinTFM.
func ValidateTFM(tfm float64) error {
	if math.IsNaN(tfm) || math.IsInf(tfm, 0) || tfm <= 0 {
		return api.Invalid("tfm", "tfm must be a positive finite number, not %s", formatTFM(tfm))
	}
	if tfm < MinTFM {
		return api.Invalid("tfm", "tfm %s is so small that every tenant's limit rounds to 0; the smallest accepted is %g", formatTFM(tfm), MinTFM)
	}
	return nil
}

// ValidateTFMFor is ValidateTFM for a system limit of maxRuns (0: not
// known): it also refuses a multiplier that leaves even a lone tenant,
// with the whole system free, a limit of 0 (maxRuns × tfm below 1), since
// then every start would be refused.
func ValidateTFMFor(tfm float64, maxRuns int) error {
	if err := ValidateTFM(tfm); err != nil {
		return err
	}
	if x := tfm * float64(maxRuns); maxRuns > 0 && math.Floor(x+slack(x)) < 1 {
		return api.Invalid("tfm", "tfm %s gives every tenant a limit of 0 with HARVEST_MAX_RUNS=%d (a tenant's limit is at most max_runs × tfm); use at least %s",
			formatTFM(tfm), maxRuns, formatTFM(1/float64(maxRuns)))
	}
	return nil
}

func formatTFM(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// maxLimit caps a computed limit so that absurd multipliers cannot overflow.
const maxLimit = math.MaxInt32

// slack absorbs binary rounding, so that for instance 0.1 × 30 counts as 3
// and not as 3.0000000000000004.
func slack(x float64) float64 { return 1e-9 * math.Max(1, math.Abs(x)) }

func clampLimit(x float64) int {
	switch {
	case x <= 0 || math.IsNaN(x):
		return 0
	case x >= maxLimit:
		return maxLimit
	}
	return int(x)
}

// Limit is the per-tenant limit under cfg when the system holds
// totalRunning unfinished runs out of maxRuns and tenants tenants are
// registered. limited is false for no_limit, where only the system limit
// applies (and limit is 0).
//
// In every case a tenant holding n runs may start another when
// n < limit, so limit is the most runs the tenant can hold at once:
//
//   - static: floor(maxRuns × TFM / max(tenants, 1));
//   - dynamic: the smallest whole number not below TFM × (maxRuns −
//     totalRunning), so that "n < limit" is exactly the rule "n < TFM ×
//     spare capacity" for whole n. It is 0 once the system is full, and it
//     may exceed maxRuns when the system is quiet (the system limit still
//     holds).
func Limit(cfg Config, maxRuns, tenants, totalRunning int) (limit int, limited bool) {
	switch cfg.Algorithm {
	case api.AlgorithmStatic:
		x := float64(maxRuns) * cfg.TFM / float64(max(tenants, 1))
		return clampLimit(math.Floor(x + slack(x))), true
	case api.AlgorithmDynamic:
		spare := max(maxRuns-totalRunning, 0)
		x := cfg.TFM * float64(spare)
		if math.IsInf(x, 1) {
			// An absurd multiplier: x - slack(x) would be NaN, not huge.
			return maxLimit, true
		}
		return clampLimit(math.Ceil(x - slack(x))), true
	default:
		return 0, false
	}
}

// Reason says which limit refused a start.
type Reason string

// The reasons of a refusal.
const (
	ReasonNone   Reason = ""
	ReasonSystem Reason = "system_limit"
	ReasonTenant Reason = "tenant_limit"
	// ReasonScheduled refuses a run not due yet: the tenant holds its
	// ScheduledCap of them.
	ReasonScheduled Reason = "scheduled_limit"
)

// DefaultRetryAfter is the retry hint of a refusal: a run has to finish
// before the tenant can get in, which takes at least a claim round trip.
const DefaultRetryAfter = time.Second

// Decision is the outcome of one admission check with the figures it was
// based on.
type Decision struct {
	Admit     bool
	Reason    Reason
	Algorithm api.Algorithm
	TFM       float64
	MaxRuns   int
	Tenants   int
	// Total is the system's unfinished runs as the check saw them.
	Total int
	// Own is the tenant's unfinished runs before this start.
	Own     int
	Limit   int
	Limited bool
	// RetryAfter is a hint for a refused caller; zero when admitted.
	RetryAfter time.Duration
	// Tenant names the tenant in the refusal message when set.
	Tenant string
	// Scheduled and ScheduledCap are the tenant's runs not due yet,
	// including this one, and the most it may hold (ReasonScheduled).
	Scheduled, ScheduledCap int
}

// Decide applies the admission rule: a start is admitted when the system
// holds fewer than maxRuns unfinished runs and, unless the algorithm is
// no_limit, the tenant holds fewer than its limit.
func Decide(cfg Config, maxRuns, tenants, total, own int) Decision {
	limit, limited := Limit(cfg, maxRuns, tenants, total)
	d := Decision{
		Algorithm: cfg.Algorithm, TFM: cfg.TFM, MaxRuns: maxRuns, Tenants: tenants,
		Total: total, Own: own, Limit: limit, Limited: limited,
	}
	switch {
	case total >= maxRuns:
		d.Reason = ReasonSystem
	case limited && own >= limit:
		d.Reason = ReasonTenant
	default:
		d.Admit = true
		return d
	}
	d.RetryAfter = DefaultRetryAfter
	return d
}

// Message explains a refusal: the algorithm, the limit in force and the
// tenant's count.
func (d Decision) Message() string {
	who := "the tenant"
	if d.Tenant != "" {
		who = "tenant " + d.Tenant
	}
	algo := string(d.Algorithm)
	if d.Algorithm != api.AlgorithmNoLimit {
		algo += " (tfm " + formatTFM(d.TFM) + ")"
	}
	switch d.Reason {
	case ReasonSystem:
		return fmt.Sprintf("admission refused: the system holds %d unfinished runs, at its read-only maximum max_runs=%d; "+
			"%s holds %d (algorithm %s%s); retry once runs finish",
			d.Total, d.MaxRuns, who, d.Own, algo, d.limitText())
	case ReasonTenant:
		return fmt.Sprintf("admission refused: %s holds %d unfinished runs and the %s limit is %d "+
			"(%d of max_runs=%d in flight); retry once its runs finish",
			who, d.Own, algo, d.Limit, d.Total, d.MaxRuns)
	case ReasonScheduled:
		return fmt.Sprintf("admission refused: %s holds %d runs that are not due yet, the most it may hold "+
			"(scheduled_share of its budget: %d); start it closer to its time, or retry once some fall due",
			who, d.Scheduled-1, d.ScheduledCap)
	}
	return "admitted"
}

func (d Decision) limitText() string {
	if !d.Limited {
		return ", no per-tenant limit"
	}
	return fmt.Sprintf(", limit %d", d.Limit)
}

// Err is the API error of a refusal (429 over_limit with retry_after_ms),
// or nil when the start is admitted.
func (d Decision) Err() *api.Error {
	if d.Admit {
		return nil
	}
	e := api.NewError(api.CodeOverLimit, "%s", d.Message())
	e.RetryAfterMS = max(d.RetryAfter.Milliseconds(), 1)
	return e
}
