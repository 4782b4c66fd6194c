package api

// The bodies of the admission routes (GET and PUT /v1/admission, GET
// /v1/usage), shared by the gateway that writes them and the clients that
// read them. The rules behind them live in pkg/tenantcap.

// Algorithm names how the per-tenant limit is computed.
type Algorithm string

// The algorithms an administrator can choose from.
const (
	// AlgorithmNoLimit applies the system limit only.
	AlgorithmNoLimit Algorithm = "no_limit"
	// AlgorithmStatic gives every registered tenant the same fixed share:
	// floor(max_runs × TFM / tenants).
	AlgorithmStatic Algorithm = "static"
	// AlgorithmDynamic lets a tenant hold fewer than TFM × (max_runs − total) runs,
	// so the share shrinks as the system fills up.
	AlgorithmDynamic Algorithm = "dynamic"
)

// Valid reports whether a is one of the known algorithms.
func (a Algorithm) Valid() bool {
	return a == AlgorithmNoLimit || a == AlgorithmStatic || a == AlgorithmDynamic
}

// Label is the algorithm's name for people ("No-Limit", "Static", "Dynamic").
func (a Algorithm) Label() string {
	switch a {
	case AlgorithmNoLimit:
		return "No-Limit"
	case AlgorithmStatic:
		return "Static"
	case AlgorithmDynamic:
		return "Dynamic"
	}
	return string(a)
}

// AdmissionView is the body of GET /v1/admission.
type AdmissionView struct {
	Algorithm Algorithm `json:"algorithm"`
	TFM       float64   `json:"tfm"`
	MaxRuns   int       `json:"max_runs"`
	// MaxRunsReadOnly is always true: no API changes max_runs.
	MaxRunsReadOnly bool `json:"max_runs_read_only"`
	// Tenants is the number of registered tenants.
	Tenants      int `json:"tenants"`
	RunningTotal int `json:"running_total"`
	// Running maps every registered tenant (0 when idle) and every tenant
	// with unfinished runs to its unfinished runs.
	Running map[string]int `json:"running"`
	// Limit is the per-tenant limit right now; null under no_limit.
	Limit *int `json:"limit"`
	// UnavailableShards lists the shards whose counts could not be read;
	// the figures above leave them out.
	UnavailableShards []int `json:"unavailable_shards,omitempty"`
	// UpdatedAt and UpdatedBy say who last changed the configuration.
	UpdatedAt string `json:"updated_at,omitempty"`
	UpdatedBy string `json:"updated_by,omitempty"`
	// ScheduledShare is the share of a tenant's budget its runs not due
	// yet may hold; ScheduledCap is that bound in runs right now.
	ScheduledShare float64 `json:"scheduled_share"`
	ScheduledCap   int     `json:"scheduled_cap"`
	// PriorityCeilings lists the tenants an operator allowed another
	// highest priority than DefaultMaxPriority.
	PriorityCeilings []PriorityCeiling `json:"priority_ceilings"`
}

// DefaultMaxPriority is the highest priority a tenant's start may carry
// unless an operator set another for it: the default priority. Priority
// sorts before the fair order of the claim, so a tenant free to choose
// 1000 would take the claims of every tenant at 0.
const DefaultMaxPriority = 0

// PriorityCeiling is the highest priority one tenant's starts may carry:
// the body of GET, PUT and DELETE /v1/tenants/{tenant}/priority.
type PriorityCeiling struct {
	Tenant      string `json:"tenant"`
	MaxPriority int    `json:"max_priority"`
	// Default is true when no operator set a ceiling for the tenant.
	Default   bool   `json:"default"`
	UpdatedAt string `json:"updated_at,omitempty"`
	UpdatedBy string `json:"updated_by,omitempty"`
}

// PriorityCeilingRequest is the body of PUT /v1/tenants/{tenant}/priority.
type PriorityCeilingRequest struct {
	MaxPriority *int `json:"max_priority"`
}

// UsageView is the body of GET /v1/usage: the caller's own figures.
type UsageView struct {
	Tenant    string    `json:"tenant"`
	Algorithm Algorithm `json:"algorithm"`
	// Running is the tenant's unfinished runs (exact).
	Running int `json:"running"`
	// Limit is the tenant's limit right now; null under no_limit, where
	// only max_runs applies.
	Limit   *int `json:"limit"`
	MaxRuns int  `json:"max_runs"`
	// MaxPriority is the highest priority the tenant's starts may carry.
	MaxPriority int `json:"max_priority"`
	// ScheduledCap is the most runs not due yet the tenant may hold.
	ScheduledCap int `json:"scheduled_cap"`
}
