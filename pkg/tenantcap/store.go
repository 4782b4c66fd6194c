package tenantcap

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/harvest-run/harvest/internal/pgrow"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/dispatch"
	"github.com/harvest-run/harvest/pkg/shard"
	"github.com/harvest-run/harvest/pkg/weights"
)

// SettingName is the key of the admission configuration in the settings
// table of shard 0.
const SettingName = "admission"

// AuditAction is the action of the audit rows this package writes.
const AuditAction = "admission.set"

// Audit outcomes.
const (
	OutcomeOK      = "ok"
	OutcomeRefused = "refused"
)

// Current is the configuration in force with who set it and when
// (database clock). A configuration nobody has set yet has a zero
// UpdatedAt and holds DefaultConfig. It is also the body of the change
// announcement on NATS.
type Current struct {
	Config
	UpdatedAt time.Time `json:"updated_at,omitzero"`
	UpdatedBy string    `json:"updated_by,omitempty"`
}

// Subject is the NATS subject on which configuration changes are
// announced: "<prefix>.admission" (prefix dispatch.DefaultPrefix when
// empty). The message is a hint only: a gateway that gets it re-reads
// shard 0.
func Subject(prefix string) string { return dispatch.Subjects{Prefix: prefix}.Admission() }

// LoadConfig reads the configuration from shard 0; DefaultConfig when
// nobody has set one. A stored value that does not validate is an error.
func LoadConfig(ctx context.Context, shard0 shard.Querier) (Current, error) {
	return readSetting(ctx, shard0, sqlSettingsGet)
}

// readSetting reads the configuration with sql (SettingsGet, SettingsLock).
func readSetting(ctx context.Context, db shard.Querier, sql string) (Current, error) {
	type setting struct {
		Value     []byte    `db:"value"`
		UpdatedAt time.Time `db:"updated_at"`
		UpdatedBy string    `db:"updated_by"`
	}
	r, err := pgrow.One[setting](ctx, db, sql, SettingName)
	if errors.Is(err, pgx.ErrNoRows) {
		return Current{Config: DefaultConfig()}, nil
	}
	if err != nil {
		return Current{}, fmt.Errorf("tenantcap: read configuration: %w", err)
	}
	cfg, err := decodeStored(r.Value)
	if err != nil {
		return Current{}, err
	}
	return Current{Config: cfg, UpdatedAt: r.UpdatedAt, UpdatedBy: r.UpdatedBy}, nil
}

// decodeStored reads a stored value; fields it lacks keep their defaults.
func decodeStored(raw []byte) (Config, error) {
	cfg := DefaultConfig()
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return Config{}, fmt.Errorf("tenantcap: stored configuration %s: %w", raw, err)
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("tenantcap: stored configuration %s: %w", raw, err)
	}
	return cfg, nil
}

// Patch is a change to the configuration: nil fields stay as they are.
type Patch struct {
	Algorithm      *api.Algorithm
	TFM            *float64
	ScheduledShare *float64
	// MaxRuns is the system limit (HARVEST_MAX_RUNS) a new TFM is checked
	// against (ValidateTFMFor); 0 checks the TFM alone.
	MaxRuns int
}

// Empty reports whether the patch changes nothing.
func (p Patch) Empty() bool { return p.Algorithm == nil && p.TFM == nil && p.ScheduledShare == nil }

// Apply returns c with the patch's fields in place.
func (p Patch) Apply(c Config) Config {
	if p.Algorithm != nil {
		c.Algorithm = *p.Algorithm
	}
	if p.TFM != nil {
		c.TFM = *p.TFM
	}
	if p.ScheduledShare != nil {
		c.ScheduledShare = *p.ScheduledShare
	}
	return c
}

// Validate checks the fields the patch sets; the *api.Error names the
// field at fault.
func (p Patch) Validate() error {
	if p.Empty() {
		return api.NewError(api.CodeInvalidArgument, "nothing to change: give algorithm, tfm, scheduled_share or several")
	}
	if p.Algorithm != nil && !p.Algorithm.Valid() {
		return api.Invalid("algorithm", "unknown algorithm %q (want no_limit, static or dynamic)", *p.Algorithm)
	}
	if p.TFM != nil {
		if err := ValidateTFMFor(*p.TFM, p.MaxRuns); err != nil {
			return err
		}
	}
	if p.ScheduledShare != nil {
		return ValidateScheduledShare(*p.ScheduledShare)
	}
	return nil
}

// auditJSON shows the patch in an audit row. A TFM that JSON cannot hold
// (NaN, ±Inf, from the command line) is kept as text.
func (p Patch) auditJSON() []byte {
	m := map[string]any{}
	if p.Algorithm != nil {
		m["algorithm"] = string(*p.Algorithm)
	}
	if p.TFM != nil {
		if math.IsNaN(*p.TFM) || math.IsInf(*p.TFM, 0) {
			m["tfm"] = formatTFM(*p.TFM)
		} else {
			m["tfm"] = *p.TFM
		}
	}
	if p.ScheduledShare != nil {
		if math.IsNaN(*p.ScheduledShare) || math.IsInf(*p.ScheduledShare, 0) {
			m["scheduled_share"] = formatTFM(*p.ScheduledShare)
		} else {
			m["scheduled_share"] = *p.ScheduledShare
		}
	}
	b, _ := json.Marshal(m)
	return b
}

// SetConfig replaces the whole configuration; see UpdateConfig.
func SetConfig(ctx context.Context, shard0 shard.Beginner, actor string, cfg Config) (Current, error) {
	p := Patch{Algorithm: &cfg.Algorithm, TFM: &cfg.TFM}
	if cfg.ScheduledShare != 0 {
		p.ScheduledShare = &cfg.ScheduledShare
	}
	return UpdateConfig(ctx, shard0, actor, p)
}

// UpdateConfig applies p to the configuration on shard 0 as actor. The new
// value and its audit row (old value, new value, outcome "ok") are written
// in one transaction. A patch that does not validate is refused with its
// *api.Error (400 naming the field) after an audit row with outcome
// "refused". Announce the result with PublishChange once this returns.
func UpdateConfig(ctx context.Context, shard0 shard.Beginner, actor string, p Patch) (Current, error) {
	if err := p.Validate(); err != nil {
		return Current{}, refuse(ctx, shard0, actor, p.auditJSON(), err)
	}
	tx, err := shard0.Begin(ctx)
	if err != nil {
		return Current{}, fmt.Errorf("tenantcap: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after commit
	def, _ := json.Marshal(DefaultConfig())
	if _, err := tx.Exec(ctx, sqlSettingsEnsure, SettingName, def); err != nil {
		return Current{}, fmt.Errorf("tenantcap: create configuration row: %w", err)
	}
	old, err := readSetting(ctx, tx, sqlSettingsLock)
	if err != nil {
		return Current{}, err
	}
	cur := Current{Config: p.Apply(old.Config), UpdatedBy: actor}
	oldJSON, _ := json.Marshal(old.Config)
	newJSON, _ := json.Marshal(cur.Config)
	if err := tx.QueryRow(ctx, sqlSettingsPut, SettingName, newJSON, actor).Scan(&cur.UpdatedAt); err != nil {
		return Current{}, fmt.Errorf("tenantcap: write configuration: %w", err)
	}
	msg := fmt.Sprintf("algorithm %s, tfm %s, scheduled_share %s", cur.Algorithm, formatTFM(cur.TFM), formatTFM(cur.Share()))
	if _, err := tx.Exec(ctx, sqlAuditInsert, actor, AuditAction, oldJSON, newJSON, OutcomeOK, msg); err != nil {
		return Current{}, fmt.Errorf("tenantcap: write audit row: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return Current{}, fmt.Errorf("tenantcap: commit configuration: %w", err)
	}
	return cur, nil
}

// RecordRefusal writes the audit row of a refused change: attempted is
// what was asked for (JSON, or any bytes, kept as text when not JSON) and
// reason why it was refused. UpdateConfig and ApplyPut call it themselves;
// a route that refuses a change before reaching them (403 on a missing
// privilege, 413) can call it too.
func RecordRefusal(ctx context.Context, shard0 shard.Querier, actor string, attempted []byte, reason error) error {
	var old []byte
	if cur, err := LoadConfig(ctx, shard0); err == nil {
		old, _ = json.Marshal(cur.Config)
	}
	msg := reason.Error()
	status := 0
	var ae *api.Error
	if errors.As(reason, &ae) {
		msg, status = ae.Message, ae.Status
		if ae.Field != "" {
			msg = ae.Field + ": " + msg
		}
	}
	// The one writer of refused rows: folded per actor and status, like
	// every refusal, so that no caller can flood the log.
	if err := weights.AuditRefused(ctx, shard0, weights.RefusedChange{Actor: actor, Action: AuditAction, Old: old,
		Attempted: attempted, Message: msg, Status: status}, weights.DefaultRefusalFold); err != nil {
		return fmt.Errorf("tenantcap: write audit row: %w", err)
	}
	return nil
}

// refuse records a refusal and returns reason (or the audit failure
// joined to it).
func refuse(ctx context.Context, shard0 shard.Querier, actor string, attempted []byte, reason error) error {
	if err := RecordRefusal(ctx, shard0, actor, attempted, reason); err != nil {
		return errors.Join(reason, err)
	}
	return reason
}

// ParsePut reads the body of PUT /v1/admission: a JSON object with
// "algorithm", "tfm" or both. Anything else is a 400 *api.Error naming
// the field at fault; "max_runs" in particular is refused as read-only.
func ParsePut(body []byte) (Patch, error) {
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&fields); err != nil || fields == nil {
		return Patch{}, api.NewError(api.CodeInvalidArgument, "the body must be a JSON object with algorithm, tfm and/or scheduled_share")
	}
	if dec.More() {
		return Patch{}, api.NewError(api.CodeInvalidArgument, "the body must hold one JSON object only")
	}
	if _, ok := fields["max_runs"]; ok {
		return Patch{}, api.Invalid("max_runs", "max_runs is read-only: it is the system limit set by HARVEST_MAX_RUNS")
	}
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	sort.Strings(names)
	var p Patch
	for _, k := range names {
		raw := fields[k]
		switch k {
		case "algorithm":
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return Patch{}, api.Invalid("algorithm", "algorithm must be a string: no_limit, static or dynamic")
			}
			a := api.Algorithm(s)
			p.Algorithm = &a
		case "tfm":
			var v float64
			if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) || json.Unmarshal(raw, &v) != nil {
				return Patch{}, api.Invalid("tfm", "tfm must be a positive finite number")
			}
			p.TFM = &v
		case "scheduled_share":
			var v float64
			if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) || json.Unmarshal(raw, &v) != nil {
				return Patch{}, api.Invalid("scheduled_share", "scheduled_share must be a number above 0 and at most 1")
			}
			p.ScheduledShare = &v
		default:
			return Patch{}, api.Invalid(k, "unknown field %q: only algorithm, tfm and scheduled_share can be set", k)
		}
	}
	if err := p.Validate(); err != nil {
		return Patch{}, err
	}
	return p, nil
}

// ApplyPut serves PUT /v1/admission: it parses body, applies it as actor
// and returns the configuration now in force. Every refusal is audited and
// comes back as a 400 *api.Error. After it succeeds, the route announces
// the change (PublishChange) and applies it locally (Watcher.Apply).
// maxRuns is the system limit a new TFM is checked against (0: none).
func ApplyPut(ctx context.Context, shard0 shard.Beginner, actor string, body []byte, maxRuns int) (Current, error) {
	p, err := ParsePut(body)
	if err != nil {
		return Current{}, refuse(ctx, shard0, actor, body, err)
	}
	p.MaxRuns = maxRuns
	return UpdateConfig(ctx, shard0, actor, p)
}

// PublishCeilings announces a change of the priority ceilings on
// Subject(prefix), the admission configuration's subject: a gateway that
// hears either re-reads both from shard 0.
func PublishCeilings(ctx context.Context, nc *nats.Conn, prefix string, changed api.PriorityCeiling) error {
	if err := dispatch.Publish(ctx, nc, Subject(prefix), changed); err != nil {
		return fmt.Errorf("tenantcap: announce change: %w", err)
	}
	return nil
}

// PublishChange announces cur on Subject(prefix). Gateways treat it as a
// hint and re-read shard 0, so a lost message only delays the change until
// their next periodic reload.
func PublishChange(ctx context.Context, nc *nats.Conn, prefix string, cur Current) error {
	if err := dispatch.Publish(ctx, nc, Subject(prefix), cur); err != nil {
		return fmt.Errorf("tenantcap: announce change: %w", err)
	}
	return nil
}
