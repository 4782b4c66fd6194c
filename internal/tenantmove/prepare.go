package tenantmove

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/dberr"
)

// fence takes D's fence down (the tenant may be coming back to it) and
// raises S's, under S's admission lock and the tenant's count row, the
// locks every start of the tenant takes before its fence check: once this
// commits, no start of the tenant can land on S.
func (m *mover) fence(ctx context.Context, src, dst int) error {
	if _, err := m.o.Shards[dst].Exec(ctx, sqlTenantFenceDrop, m.tenant); err != nil {
		return fmt.Errorf("tenantmove: fence: unfence shard %d: %w", dst, err)
	}
	err := inTx(ctx, m.o.Shards[src], func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlShardAdmissionLock); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlTenantRunningLock, m.tenant); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sqlTenantFenceRaise, m.tenant, dst)
		return err
	})
	if err != nil {
		return fmt.Errorf("tenantmove: fence shard %d: %w", src, err)
	}
	return nil
}

// prepare carries to D what the tenant's runs will need there: the debts
// of its fairness keys, its weight overrides and quotas, and the count of
// its runs still on S.
// It returns that count.
func (m *mover) prepare(ctx context.Context, src, dst int) (int, error) {
	if err := m.carryDebts(ctx, src, dst); err != nil {
		return 0, err
	}
	if err := m.carrySettings(ctx, src, dst); err != nil {
		return 0, err
	}
	var away int64
	err := inTx(ctx, m.o.Shards[dst], func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlShardAdmissionLock); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlTenantRunningLock, m.tenant); err != nil {
			return err
		}
		// S is fenced, so its figure can only fall from here on; the copy
		// steps lower this one as runs arrive.
		if err := m.o.Shards[src].QueryRow(ctx, sqlTenantRunningRead, m.tenant).Scan(&away); err != nil {
			return fmt.Errorf("read shard %d: %w", src, err)
		}
		_, err := tx.Exec(ctx, sqlTenantAwaySet, m.tenant, away)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("tenantmove: prepare: count runs away on shard %d: %w", dst, err)
	}
	return int(away), nil
}

// debt is a key of the tenant that is ahead of its queue's clock on S.
type debt struct {
	Queue string  `db:"queue"`
	Key   string  `db:"key"`
	Lag   float64 `db:"lag"`
}

// carryDebts keeps each of the tenant's keys as far behind in the fair
// order on D as it was on S. In the start-time fair model a key's next
// claim starts at max(pass, V), V being the queue's clock, so what decides
// its place against the other keys is its lag pass - V; the absolute
// figures mean nothing on another shard, whose clock runs on its own. A
// key without lag (pass <= V) starts at V like a new key, which is what it
// gets on D with no row at all, so only keys in debt are written: pass =
// V_D + lag (or the key's own pass on D when it owes more there), with
// last_start kept at or below V_D so that the carried debt never moves D's
// clock, and in_debt set, as pass > V_D. Weights are not part of the lag:
// they are carried with the overrides.
func (m *mover) carryDebts(ctx context.Context, src, dst int) error {
	rows, err := m.o.Shards[src].Query(ctx, sqlFairStateDebts, m.tenant, subKeys(m.tenant))
	if err != nil {
		return fmt.Errorf("tenantmove: prepare: read fairness state of shard %d: %w", src, err)
	}
	debts, err := pgx.CollectRows(rows, pgx.RowToStructByName[debt])
	if err != nil {
		return fmt.Errorf("tenantmove: prepare: read fairness state of shard %d: %w", src, err)
	}
	for _, d := range debts {
		err := inTx(ctx, m.o.Shards[dst], func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sqlFairQueueLock, d.Queue); err != nil {
				return err
			}
			var clock float64
			if err := tx.QueryRow(ctx, sqlFairQueueEnsure, d.Queue).Scan(&clock); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sqlFairStateCarry, d.Queue, d.Key, d.Lag, clock)
			return err
		})
		if err != nil {
			return fmt.Errorf("tenantmove: prepare: carry the debt of %s/%s to shard %d: %w", d.Queue, d.Key, dst, err)
		}
	}
	return nil
}

// override is one weight override of the tenant's keys.
type override struct {
	Queue     string    `db:"queue"`
	Key       string    `db:"key"`
	Weight    float64   `db:"weight"`
	UpdatedAt time.Time `db:"updated_at"`
	UpdatedBy string    `db:"updated_by"`
}

// carrySettings copies the tenant's weight overrides and quotas to D,
// leaving any D has (written by the all-shard fan-out, so newer or equal)
// and those on S (another move may need them; they cost nothing there).
func (m *mover) carrySettings(ctx context.Context, src, dst int) error {
	rows, err := m.o.Shards[src].Query(ctx, sqlWeightOverrideRead, m.tenant, subKeys(m.tenant))
	if err != nil {
		return fmt.Errorf("tenantmove: prepare: read weight overrides of shard %d: %w", src, err)
	}
	ovs, err := pgx.CollectRows(rows, pgx.RowToStructByName[override])
	if err != nil {
		return fmt.Errorf("tenantmove: prepare: read weight overrides of shard %d: %w", src, err)
	}
	for _, ov := range ovs {
		// One statement each, so that the cap refusing one leaves the
		// others to be written.
		_, err := m.o.Shards[dst].Exec(ctx, sqlWeightOverrideCopy, ov.Queue, ov.Key, ov.Weight, ov.UpdatedAt, ov.UpdatedBy)
		if dberr.Code(err) == dberr.CodeCheckViolation {
			m.o.Log.Warn("tenantmove: the queue's override cap refused a weight override; it is not carried",
				"tenant", m.tenant, "queue", ov.Queue, "key", ov.Key, "shard", dst)
			continue
		}
		if err != nil {
			return fmt.Errorf("tenantmove: prepare: copy the weight of %s/%s to shard %d: %w", ov.Queue, ov.Key, dst, err)
		}
	}
	var quotas json.RawMessage
	if err := m.o.Shards[src].QueryRow(ctx, sqlQuotaRead, m.tenant, subKeys(m.tenant)).Scan(&quotas); err != nil {
		return fmt.Errorf("tenantmove: prepare: read quotas of shard %d: %w", src, err)
	}
	if _, err := m.o.Shards[dst].Exec(ctx, sqlQuotaCopy, string(quotas)); err != nil {
		return fmt.Errorf("tenantmove: prepare: copy quotas to shard %d: %w", dst, err)
	}
	return nil
}
