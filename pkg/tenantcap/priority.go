package tenantcap

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/pgrow"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/shard"
	"github.com/harvest-run/harvest/pkg/weights"
)

// Priority ceilings. A run's priority sorts before the fair order of the
// claim, so a tenant free to give its runs any priority could put a flood
// ahead of every other tenant's work and undo fairness. A tenant's start
// may therefore carry at most its ceiling: api.DefaultMaxPriority (0, the
// default priority) unless an operator set another one for it. Below its
// ceiling a tenant orders its own runs as it likes. The ceilings live in
// tenant_priority on shard 0, beside the admission configuration; each
// change writes an audit row, and gateways serve them from the Watcher.

// PriorityAction is the audit action of a ceiling change.
const PriorityAction = "tenant.priority"

// MaxPriorityCeilings bounds the tenants that may have a ceiling of their
// own, so the table every gateway keeps in memory stays small.
const MaxPriorityCeilings = 10000

// Ceilings are the priority ceilings operators set, by tenant.
type Ceilings map[string]api.PriorityCeiling

// MaxPriority is tenant's ceiling: its own, or api.DefaultMaxPriority.
func (c Ceilings) MaxPriority(tenant string) int {
	if p, ok := c[tenant]; ok {
		return p.MaxPriority
	}
	return api.DefaultMaxPriority
}

// Ceiling is tenant's ceiling as the API shows it.
func (c Ceilings) Ceiling(tenant string) api.PriorityCeiling {
	if p, ok := c[tenant]; ok {
		return p
	}
	return api.PriorityCeiling{Tenant: tenant, MaxPriority: api.DefaultMaxPriority, Default: true}
}

// List is the ceilings in tenant order.
func (c Ceilings) List() []api.PriorityCeiling {
	out := make([]api.PriorityCeiling, 0, len(c))
	for _, p := range c {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b api.PriorityCeiling) int { return strings.Compare(a.Tenant, b.Tenant) })
	return out
}

// LoadCeilings reads every ceiling from shard 0.
func LoadCeilings(ctx context.Context, shard0 shard.Querier) (Ceilings, error) {
	rows, err := shard0.Query(ctx, sqlPriorityList, MaxPriorityCeilings)
	if err != nil {
		return nil, fmt.Errorf("tenantcap: read priority ceilings: %w", err)
	}
	type row struct {
		Tenant      string    `db:"tenant"`
		MaxPriority int32     `db:"max_priority"`
		UpdatedAt   time.Time `db:"updated_at"`
		UpdatedBy   string    `db:"updated_by"`
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByName[row])
	if err != nil {
		return nil, fmt.Errorf("tenantcap: read priority ceilings: %w", err)
	}
	out := make(Ceilings, len(got))
	for _, r := range got {
		out[r.Tenant] = api.PriorityCeiling{Tenant: r.Tenant, MaxPriority: int(r.MaxPriority),
			UpdatedAt: stamp(r.UpdatedAt), UpdatedBy: r.UpdatedBy}
	}
	return out, nil
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000Z07:00") }

// ParseCeilingPut reads the body of PUT /v1/tenants/{tenant}/priority:
// {"max_priority": n}. A 400 *api.Error names the field at fault.
func ParseCeilingPut(body []byte) (int, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var req api.PriorityCeilingRequest
	if err := dec.Decode(&req); err != nil {
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) {
			return 0, api.Invalid("max_priority", "max_priority must be an integer from %d to %d", api.MinPriority, api.MaxPriority)
		}
		return 0, api.NewError(api.CodeInvalidArgument, "the body must be a JSON object {\"max_priority\": n}: %v", err)
	}
	if dec.More() {
		return 0, api.NewError(api.CodeInvalidArgument, "the body must hold one JSON object only")
	}
	if req.MaxPriority == nil {
		return 0, api.Invalid("max_priority", "max_priority is required")
	}
	return *req.MaxPriority, nil
}

// validateCeiling checks a ceiling change's tenant and value.
func validateCeiling(tenant string, maxPriority int) error {
	if err := auth.ValidateTenant(tenant); err != nil {
		return api.Invalid("tenant", "%v", err)
	}
	if maxPriority < api.MinPriority || maxPriority > api.MaxPriority {
		return api.Invalid("max_priority", "max_priority must be from %d to %d, got %d", api.MinPriority, api.MaxPriority, maxPriority)
	}
	return nil
}

// SetCeiling sets tenant's priority ceiling on shard 0 as actor, with its
// audit row in the same transaction. A bad tenant or value is refused (400
// naming the field), as is a new tenant past MaxPriorityCeilings (409).
// The caller audits a refusal (RecordCeilingRefusal; the gateway's routes
// do it for every refusal they answer). Announce the change with
// PublishCeilings.
func SetCeiling(ctx context.Context, shard0 shard.Beginner, actor, tenant string, maxPriority int) (api.PriorityCeiling, error) {
	attempted, _ := json.Marshal(map[string]any{"tenant": tenant, "max_priority": maxPriority})
	if err := validateCeiling(tenant, maxPriority); err != nil {
		return api.PriorityCeiling{}, err
	}
	tx, err := shard0.Begin(ctx)
	if err != nil {
		return api.PriorityCeiling{}, fmt.Errorf("tenantcap: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after commit
	if _, err := tx.Exec(ctx, sqlPriorityLock); err != nil {
		return api.PriorityCeiling{}, fmt.Errorf("tenantcap: lock priority ceilings: %w", err)
	}
	type set struct {
		Old       *int32    `db:"old_max"`
		Now       int32     `db:"max_priority"`
		UpdatedAt time.Time `db:"updated_at"`
		UpdatedBy string    `db:"updated_by"`
	}
	r, err := pgrow.One[set](ctx, tx, sqlPrioritySet, tenant, maxPriority, actor, MaxPriorityCeilings)
	if errors.Is(err, pgx.ErrNoRows) {
		return api.PriorityCeiling{}, api.NewError(api.CodeConflict,
			"%d tenants have a priority ceiling of their own, the most there may be; clear one first", MaxPriorityCeilings)
	}
	if err != nil {
		return api.PriorityCeiling{}, fmt.Errorf("tenantcap: set priority ceiling: %w", err)
	}
	oldJSON, _ := json.Marshal(ceilingDoc(tenant, r.Old))
	msg := fmt.Sprintf("tenant %s may start runs up to priority %d", tenant, r.Now)
	if _, err := tx.Exec(ctx, sqlAuditInsert, actor, PriorityAction, oldJSON, attempted, OutcomeOK, msg); err != nil {
		return api.PriorityCeiling{}, fmt.Errorf("tenantcap: write audit row: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return api.PriorityCeiling{}, fmt.Errorf("tenantcap: commit priority ceiling: %w", err)
	}
	return api.PriorityCeiling{Tenant: tenant, MaxPriority: int(r.Now), UpdatedAt: stamp(r.UpdatedAt), UpdatedBy: r.UpdatedBy}, nil
}

// ClearCeiling puts tenant back to the default ceiling as actor, audited.
// Clearing a tenant without a ceiling of its own changes nothing and
// writes no row. As with SetCeiling, the caller audits a refusal.
func ClearCeiling(ctx context.Context, shard0 shard.Beginner, actor, tenant string) (api.PriorityCeiling, error) {
	if err := auth.ValidateTenant(tenant); err != nil {
		return api.PriorityCeiling{}, api.Invalid("tenant", "%v", err)
	}
	tx, err := shard0.Begin(ctx)
	if err != nil {
		return api.PriorityCeiling{}, fmt.Errorf("tenantcap: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after commit
	var old int32
	err = tx.QueryRow(ctx, sqlPriorityClear, tenant).Scan(&old)
	if errors.Is(err, pgx.ErrNoRows) {
		return Ceilings(nil).Ceiling(tenant), nil
	}
	if err != nil {
		return api.PriorityCeiling{}, fmt.Errorf("tenantcap: clear priority ceiling: %w", err)
	}
	oldJSON, _ := json.Marshal(ceilingDoc(tenant, &old))
	newJSON, _ := json.Marshal(ceilingDoc(tenant, nil))
	msg := fmt.Sprintf("tenant %s back to the default ceiling %d", tenant, api.DefaultMaxPriority)
	if _, err := tx.Exec(ctx, sqlAuditInsert, actor, PriorityAction, oldJSON, newJSON, OutcomeOK, msg); err != nil {
		return api.PriorityCeiling{}, fmt.Errorf("tenantcap: write audit row: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return api.PriorityCeiling{}, fmt.Errorf("tenantcap: commit priority ceiling: %w", err)
	}
	return Ceilings(nil).Ceiling(tenant), nil
}

// ceilingDoc is a ceiling in an audit row; nil is the default.
func ceilingDoc(tenant string, maxPriority *int32) map[string]any {
	if maxPriority == nil {
		return map[string]any{"tenant": tenant, "max_priority": api.DefaultMaxPriority, "default": true}
	}
	return map[string]any{"tenant": tenant, "max_priority": *maxPriority}
}

// RecordCeilingRefusal writes the audit row of a refused ceiling change
// (attempted is what was asked for), folded like every refusal.
func RecordCeilingRefusal(ctx context.Context, shard0 shard.Querier, actor string, attempted []byte, reason error) error {
	msg, status := reason.Error(), 0
	var ae *api.Error
	if errors.As(reason, &ae) {
		msg, status = ae.Message, ae.Status
		if ae.Field != "" {
			msg = ae.Field + ": " + msg
		}
	}
	if err := weights.AuditRefused(ctx, shard0, weights.RefusedChange{Actor: actor, Action: PriorityAction,
		Attempted: attempted, Message: msg, Status: status}, weights.DefaultRefusalFold); err != nil {
		return fmt.Errorf("tenantcap: write audit row: %w", err)
	}
	return nil
}

// CheckPriority refuses a start whose priority is above its tenant's
// ceiling: 403 permission_denied naming the field and the ceiling.
func CheckPriority(ceilings Ceilings, tenant string, priority int) *api.Error {
	ceiling := ceilings.MaxPriority(tenant)
	if priority <= ceiling {
		return nil
	}
	e := api.NewError(api.CodePermissionDenied,
		"priority %d is above %d, the highest tenant %s may use: priority orders a tenant's own runs up to its ceiling, "+
			"and only an operator can raise the ceiling (PUT /v1/tenants/%s/priority)", priority, ceiling, tenant, tenant)
	e.Field = "priority"
	return e
}
