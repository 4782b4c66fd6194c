package tenantmove

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/pgrow"
	"github.com/harvest-run/harvest/pkg/dispatch"
)

// errLiveMovingTask means a run had a task hidden for the move and another
// still in play: a run never has two live tasks, so the hide is rolled back.
var errLiveMovingTask = errors.New("tenantmove: a run has a moving task and another live one")

// copyAll moves the tenant's runs from S to D in batches until none is
// left on S. A run with a task leased to a worker stays until the task
// ends (the worker reports to S); the loop then looks again every Poll.
func (m *mover) copyAll(ctx context.Context, src, dst int) error {
	for {
		batch, err := m.hide(ctx, src, dst)
		if err != nil {
			return err
		}
		if len(batch) > 0 {
			m.rep.Batches++
			n := m.rep.Batches
			if err := m.step(Step{Name: "hide", Batch: n, Runs: len(batch)}); err != nil {
				return err
			}
			copied, err := m.copyBatch(ctx, src, dst, batch)
			if err != nil {
				return err
			}
			m.rep.Runs += copied
			if err := m.step(Step{Name: "copy", Batch: n, Runs: copied}); err != nil {
				return err
			}
			dropped, err := m.drop(ctx, src, batch)
			if err != nil {
				return err
			}
			left, err := pgrow.One[runsLeft](ctx, m.o.Shards[src], sqlRunTenantLeft, m.tenant)
			if err != nil {
				return fmt.Errorf("tenantmove: count runs left on shard %d: %w", src, err)
			}
			if err := m.step(Step{Name: "drop", Batch: n, Runs: dropped, Waiting: int(left.Runs)}); err != nil {
				return err
			}
			continue
		}
		left, err := pgrow.One[runsLeft](ctx, m.o.Shards[src], sqlRunTenantLeft, m.tenant)
		if err != nil {
			return fmt.Errorf("tenantmove: count runs left on shard %d: %w", src, err)
		}
		if left.Runs == 0 {
			return nil
		}
		if deferred := left.Deferred; deferred > 0 {
			// The deferred step ran under S's fence, after which no
			// deferred start of the tenant can be written on S.
			return fmt.Errorf("tenantmove: %d deferred runs of %s appeared on shard %d after it was fenced", deferred, m.tenant, src)
		}
		if m.o.Progress != nil && time.Since(m.lastWait) >= time.Second {
			m.lastWait = time.Now()
			m.o.Progress(Step{Name: "wait", Batch: m.rep.Batches, Waiting: int(left.Runs)})
		}
		if err := sleep(ctx, m.o.Poll); err != nil {
			return err
		}
	}
}

// hide takes the next batch off S's claimers and cancels, in one
// transaction on S, and returns it. A batch an earlier move left half done
// (in move_out) comes first, as it is.
func (m *mover) hide(ctx context.Context, src, dst int) ([]int64, error) {
	db := m.o.Shards[src]
	left, err := collectPKs(db.Query(ctx, sqlMoveOutOfTenant, m.tenant, m.o.Batch))
	if err != nil {
		return nil, fmt.Errorf("tenantmove: hide: read move_out of shard %d: %w", src, err)
	}
	if len(left) > 0 {
		return left, nil
	}
	var batch []int64
	err = inTx(ctx, db, func(tx pgx.Tx) error {
		batch = nil
		cands, err := collectPKs(tx.Query(ctx, sqlRunMoveCandidates, m.tenant, m.o.Batch))
		if err != nil || len(cands) == 0 {
			return err
		}
		// Tasks first, then runs: the lock order of claims and cancels.
		if _, err := tx.Exec(ctx, sqlTaskHide, cands); err != nil {
			return err
		}
		locked, err := collectPKs(tx.Query(ctx, sqlRunLockMany, cands))
		if err != nil {
			return err
		}
		// A claim, a continuation or a retry that committed before the
		// run's lock left a task in play: that run stays for a later batch.
		live, err := collectPKs(tx.Query(ctx, sqlTaskLiveOfRuns, locked))
		if err != nil {
			return err
		}
		var stay []int64
		for _, pk := range locked {
			if slices.Contains(live, pk) {
				stay = append(stay, pk)
			} else {
				batch = append(batch, pk)
			}
		}
		if len(stay) > 0 {
			moving, err := collectPKs(tx.Query(ctx, sqlTaskMovingOfRuns, stay))
			if err != nil {
				return err
			}
			if len(moving) > 0 {
				return fmt.Errorf("%w (run %d)", errLiveMovingTask, moving[0])
			}
		}
		if len(batch) == 0 {
			return nil
		}
		_, err = tx.Exec(ctx, sqlMoveOutAdd, batch, m.tenant, dst)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("tenantmove: hide runs on shard %d: %w", src, err)
	}
	return batch, nil
}

// runHead is what the copy needs to know of a run's JSON row.
type runHead struct {
	ID         string  `json:"id"`
	FinishedAt *string `json:"finished_at"`
}

// copyBatch writes the batch's runs and moving tasks on D, with the
// capacity for the unfinished ones, and returns how many runs it wrote
// (fewer than the batch on a rerun: those D holds stay as they are).
func (m *mover) copyBatch(ctx context.Context, src, dst int, batch []int64) (int, error) {
	var runs, tasks json.RawMessage
	if err := m.o.Shards[src].QueryRow(ctx, sqlRunCopyRead, batch).Scan(&runs); err != nil {
		return 0, fmt.Errorf("tenantmove: copy: read runs of shard %d: %w", src, err)
	}
	if err := m.o.Shards[src].QueryRow(ctx, sqlTaskCopyRead, batch).Scan(&tasks); err != nil {
		return 0, fmt.Errorf("tenantmove: copy: read tasks of shard %d: %w", src, err)
	}
	n, err := m.write(ctx, src, dst, runs, nil, func(tx pgx.Tx, ids []string, pks []int64) error {
		_, err := tx.Exec(ctx, sqlTaskCopyInsert, string(tasks), ids, pks)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("tenantmove: copy to shard %d: %w", dst, err)
	}
	m.wake(ctx, dst, tasks)
	return n, nil
}

// wake tells the new home's workers that the copied tasks wait in their
// queues, so they claim them now rather than at their next poll. It is a
// hint: a lost one costs latency only.
func (m *mover) wake(ctx context.Context, dst int, tasks json.RawMessage) {
	if m.o.NATS == nil {
		return
	}
	var rows []struct {
		Queue string `json:"queue"`
		State string `json:"state"`
	}
	if json.Unmarshal(tasks, &rows) != nil {
		return
	}
	perQueue := map[string]int{}
	for _, r := range rows {
		if r.State == "moving" {
			perQueue[r.Queue]++
		}
	}
	subjects := dispatch.Subjects{Prefix: m.o.Prefix}
	for q, n := range perQueue {
		if err := dispatch.Publish(ctx, m.o.NATS, subjects.Wake(dst, q), dispatch.Wake{Tasks: n}); err != nil {
			m.o.Log.Debug("tenantmove: wake the new home's workers", "shard", dst, "queue", q, "err", err)
		}
	}
}

// write inserts runs (JSON rows of RunCopyRead) on D in one transaction,
// under D's admission lock and the tenant's count row, as a start would,
// runs before with what else the transaction writes, and moves the
// unfinished ones written from the tenant's count away to its count on D.
func (m *mover) write(ctx context.Context, src, dst int, runs json.RawMessage, before func(pgx.Tx) error,
	after func(tx pgx.Tx, ids []string, pks []int64) error) (int, error) {
	var heads []runHead
	if err := json.Unmarshal(runs, &heads); err != nil {
		return 0, fmt.Errorf("decode runs: %w", err)
	}
	if len(heads) == 0 {
		return 0, nil
	}
	ids := make([]string, len(heads))
	for i, h := range heads {
		ids[i] = h.ID
	}
	held, err := collectStrings(m.o.Shards[dst].Query(ctx, sqlRunHeldIDs, m.tenant, ids))
	if err != nil {
		return 0, fmt.Errorf("read runs held: %w", err)
	}
	has := map[string]bool{}
	for _, id := range held {
		has[id] = true
	}
	need := 0
	for _, h := range heads {
		if h.FinishedAt == nil && !has[h.ID] {
			need++
		}
	}
	for {
		if err := m.capacity(ctx, src, dst, need); err != nil {
			return 0, err
		}
		written, err := m.writeTx(ctx, dst, runs, need, before, after)
		if !errors.Is(err, errShortLease) {
			return written, err
		}
		// A start took the room between the lease and the write.
	}
}

// errShortLease means the shard's lease no longer covered the runs to be
// written once the write held the shard's admission lock.
var errShortLease = errors.New("tenantmove: the new home's lease is short")

// writeTx is write's transaction on D: the runs (with what before and
// after write), the counts, and the check that D's lease covers the need
// unfinished runs, under D's admission lock.
func (m *mover) writeTx(ctx context.Context, dst int, runs json.RawMessage, need int, before func(pgx.Tx) error,
	after func(tx pgx.Tx, ids []string, pks []int64) error) (int, error) {
	var written int
	err := inTx(ctx, m.o.Shards[dst], func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlShardAdmissionLock); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlTenantRunningLock, m.tenant); err != nil {
			return err
		}
		if need > 0 {
			var room bool
			if err := tx.QueryRow(ctx, sqlShardLeaseRoom, need).Scan(&room); err != nil {
				return err
			}
			if !room {
				return errShortLease
			}
		}
		if before != nil {
			if err := before(tx); err != nil {
				return err
			}
		}
		copied, err := pgrow.All[copiedRun](ctx, tx, sqlRunCopyInsert, string(runs))
		if err != nil {
			return err
		}
		var (
			newIDs     []string
			newPKs     []int64
			unfinished int
		)
		for _, r := range copied {
			newIDs, newPKs = append(newIDs, r.ID), append(newPKs, r.PK)
			if r.Unfinished {
				unfinished++
			}
		}
		if after != nil && len(newIDs) > 0 {
			if err := after(tx, newIDs, newPKs); err != nil {
				return err
			}
		}
		if unfinished > 0 {
			if _, err := tx.Exec(ctx, sqlTenantRunningAdd, m.tenant, unfinished); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, sqlTenantAwayLower, m.tenant, unfinished); err != nil {
				return err
			}
		}
		written = len(newIDs)
		return nil
	})
	return written, err
}

// capacity makes D's lease cover its runs and need more. S's idle
// capacity, left by the runs already moved, is the first place to look;
// when the ledger has none to spare the copy waits for runs to finish.
func (m *mover) capacity(ctx context.Context, src, dst, need int) error {
	if need == 0 {
		return nil
	}
	for {
		var total int64
		if err := m.o.Shards[dst].QueryRow(ctx, sqlTenantRunningShardTotal).Scan(&total); err != nil {
			return fmt.Errorf("read the count of shard %d: %w", dst, err)
		}
		want := int(total) + need
		lease, err := m.leases.Acquire(ctx, dst, int(total), want)
		if err != nil {
			return fmt.Errorf("capacity of shard %d: %w", dst, err)
		}
		if lease >= want {
			return nil
		}
		if _, err := m.leases.GiveBack(ctx, src, 0); err != nil {
			m.o.Log.Debug("tenantmove: give back the old home's idle capacity", "shard", src, "err", err)
		}
		if lease, err = m.leases.Acquire(ctx, dst, int(total), want); err != nil {
			return fmt.Errorf("capacity of shard %d: %w", dst, err)
		}
		if lease >= want {
			return nil
		}
		if !m.capLogged {
			m.capLogged = true
			m.o.Log.Info("tenantmove: waiting for capacity", "tenant", m.tenant, "shard", dst, "need", want, "lease", lease)
			if m.o.Progress != nil {
				m.o.Progress(Step{Name: "capacity", Batch: m.rep.Batches, Runs: want, Waiting: lease})
			}
		}
		if err := sleep(ctx, m.o.Poll); err != nil {
			return err
		}
	}
}

// drop deletes the copied batch on S and lowers the tenant's count there
// by its unfinished runs; S's capacity beyond a block goes back to the
// ledger for D to take.
func (m *mover) drop(ctx context.Context, src int, batch []int64) (int, error) {
	var dropped int
	err := inTx(ctx, m.o.Shards[src], func(tx pgx.Tx) error {
		// Finishing only lowers S's count: no admission lock.
		if _, err := tx.Exec(ctx, sqlTenantRunningLock, m.tenant); err != nil {
			return err
		}
		var err error
		dropped, err = m.dropRuns(ctx, tx, batch)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("tenantmove: drop runs on shard %d: %w", src, err)
	}
	if _, err := m.leases.GiveBack(ctx, src, m.leases.Block()); err != nil {
		m.o.Log.Debug("tenantmove: give back the old home's idle capacity", "shard", src, "err", err)
	}
	return dropped, nil
}

// dropRuns deletes runs pks in tx, which holds the tenant's count row, and
// lowers the count by the unfinished ones.
func (m *mover) dropRuns(ctx context.Context, tx pgx.Tx, pks []int64) (int, error) {
	rows, err := tx.Query(ctx, sqlRunDropMany, pks)
	if err != nil {
		return 0, err
	}
	unfinished, err := pgx.CollectRows(rows, pgx.RowTo[bool])
	if err != nil {
		return 0, err
	}
	n, open := len(unfinished), 0
	for _, u := range unfinished {
		if u {
			open++
		}
	}
	if open > 0 {
		if _, err := tx.Exec(ctx, sqlTenantRunningAdd, m.tenant, -open); err != nil {
			return 0, err
		}
	}
	return n, nil
}

func collectPKs(rows pgx.Rows, err error) ([]int64, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

func collectStrings(rows pgx.Rows, err error) ([]string, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// runsLeft is what RunTenantLeft counts of the tenant's runs on a shard.
type runsLeft struct {
	Runs     int64 `db:"runs"`
	Deferred int64 `db:"deferred"`
}

// copiedRun is a row of RunCopyInsert: a run written on the new home.
type copiedRun struct {
	PK         int64  `db:"pk"`
	ID         string `db:"id"`
	Unfinished bool   `db:"unfinished"`
}
