package runstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/sqlfile"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/shard"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

func mustSQL(name string) string { return sqlfile.Must(sqlFiles, name) }

var (
	sqlRunStart        = mustSQL("RunStart")
	sqlRunStartGroup   = mustSQL("RunStartGroup")
	sqlRunStartFlush   = mustSQL("RunStartFlush")
	sqlRunGet          = mustSQL("RunGet")
	sqlRunList         = mustSQL("RunList")
	sqlRunLock         = mustSQL("RunLock")
	sqlRunFinish       = mustSQL("RunFinish")
	sqlTaskCancelByRun = mustSQL("TaskCancelByRun")
	sqlRunMoveCheck    = mustSQL("RunMoveCheck")

	sqlRunGetManyHashed = mustSQL("RunGetManyHashed")

	sqlTenantRunningLock = mustSQL("TenantRunningLock")
)

// ErrConflict means a run with the same id exists but was started with a
// different request.
var ErrConflict = errors.New("runstore: a run with this id exists with a different request")

// ErrNotFound means the tenant has no run with that id.
var ErrNotFound = errors.New("runstore: run not found")

// Beginner opens transactions: a *pgxpool.Pool or a *pgx.Conn.
type Beginner = shard.Beginner

// StartParams is one validated start, bound to its tenant and shard.
type StartParams struct {
	Tenant string
	Shard  int
	// Req must have passed Validate and carry its final id.
	Req api.StartRequest
	// TraceContext is the start span's W3C context, stored with the task so
	// the claim and execution spans link back to it.
	TraceContext json.RawMessage
	// Fired marks the run of a deferred start that fires: its id was
	// reserved on this shard when the start was accepted, so it is written
	// here even after the tenant moved away (the move then copies it).
	Fired bool
}

// StartResult is what a start did.
type StartResult struct {
	Run api.Run
	// Created is true for a new run (HTTP 201), false for a replay (200).
	Created bool
	// TaskID is the first task's id; zero on a replay.
	TaskID int64
	// QueueBusy reports that the queue already had pending tasks when the
	// run was written (read in the same statement). A new task in an idle
	// queue is worth a dispatch; in a busy one the fair claim decides.
	QueueBusy bool
	// Running is the tenant's count of unfinished runs on this shard after
	// the start (zero on a replay).
	Running int
	// ShardRunning is the shard's count of unfinished runs over all
	// tenants after the start (zero on a replay).
	ShardRunning int
	// ShardLease is the shard's capacity lease as the start read it, after
	// the shard's admission lock (zero on a replay).
	ShardLease int
	// Scheduled is the tenant's count of runs not due yet on this shard
	// after the start, this one included, when this run is not due yet;
	// zero when it is due (and on a replay).
	Scheduled int
}

// Start writes a new run with its first task and counts it for its tenant,
// all in one transaction. A replay of the same request returns the
// existing run with Created false; the same id with a different request
// returns ErrConflict. Nothing is written unless everything is.
func Start(ctx context.Context, db Beginner, p StartParams) (StartResult, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return StartResult{}, fmt.Errorf("runstore: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after commit
	res, err := StartTx(ctx, tx, p)
	if err != nil {
		return StartResult{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return StartResult{}, fmt.Errorf("runstore: commit start: %w", err)
	}
	return res, nil
}

// StartTx is Start inside a transaction the caller owns, so several starts
// can share one commit. On error the caller must roll back (or roll back to
// a savepoint), since part of the start may have been written.
func StartTx(ctx context.Context, tx pgx.Tx, p StartParams) (StartResult, error) {
	row, err := startRowOf(&p)
	if err != nil {
		return StartResult{}, err
	}
	res, found, err := scanStarted(tx.QueryRow(ctx, sqlRunStart, row.args()...), p.Shard)
	if err != nil {
		return StartResult{}, err
	}
	if found {
		return res, nil
	}
	return replay(ctx, tx, &p, row.hash)
}

// startRow is one start as the start statements take it: the columns of
// its run and first task.
type startRow struct {
	tenant, id, name, queue, key, quota string
	priority, maxAttempts               int
	input, trace                        *string // JSON text
	hash                                []byte
	timeoutMS                           *int64
	runAt                               *time.Time
	delayUS                             int64
	fired                               bool
}

// startRowOf checks p and builds its row.
func startRowOf(p *StartParams) (startRow, error) {
	r := &p.Req
	if r.ID == "" {
		return startRow{}, errors.New("runstore: start without a run id")
	}
	hash, err := RequestHash(r)
	if err != nil {
		return startRow{}, err
	}
	row := startRow{
		tenant: p.Tenant, id: r.ID, name: r.Name, queue: r.Queue, key: r.Key(), quota: quotaKey(r),
		priority: r.Priority, maxAttempts: api.DefaultMaxAttempts, hash: hash, fired: p.Fired,
	}
	if r.MaxAttempts != nil {
		row.maxAttempts = *r.MaxAttempts
	}
	if r.Timeout != nil {
		ms := max(time.Duration(*r.Timeout).Milliseconds(), 1)
		row.timeoutMS = &ms
	}
	if len(r.Input) > 0 {
		in := string(r.Input)
		row.input = &in
	}
	if len(p.TraceContext) > 0 {
		tc := string(p.TraceContext)
		row.trace = &tc
	}
	if r.RunAt != nil {
		row.runAt = &r.RunAt.Time
	}
	if r.Delay != nil && *r.Delay > 0 {
		row.delayUS = time.Duration(*r.Delay).Microseconds()
	}
	return row, nil
}

// args are the parameters of RunStart.
func (r *startRow) args() []any {
	return []any{r.tenant, r.id, r.name, r.queue, r.key, r.quota, r.priority, r.input, r.hash,
		r.maxAttempts, r.timeoutMS, r.runAt, r.delayUS, r.trace, r.fired}
}

// manyArgs are the start arrays of RunStartGroup for starts, in order.
func manyArgs(starts []*pending) []any {
	n := len(starts)
	var (
		tenants, ids, names = make([]string, n), make([]string, n), make([]string, n)
		queues, keys, quota = make([]string, n), make([]string, n), make([]string, n)
		priorities, tries   = make([]int32, n), make([]int32, n)
		inputs, traces      = make([]*string, n), make([]*string, n)
		hashes              = make([][]byte, n)
		timeouts            = make([]*int64, n)
		runAts              = make([]*time.Time, n)
		delays              = make([]int64, n)
	)
	for i, it := range starts {
		r := &it.row
		tenants[i], ids[i], names[i], queues[i], keys[i], quota[i] = r.tenant, r.id, r.name, r.queue, r.key, r.quota
		priorities[i], tries[i] = int32(r.priority), int32(r.maxAttempts)
		inputs[i], traces[i], hashes[i] = r.input, r.trace, r.hash
		timeouts[i], runAts[i], delays[i] = r.timeoutMS, r.runAt, r.delayUS
	}
	return []any{tenants, ids, names, queues, keys, quota, priorities, inputs, hashes, tries,
		timeouts, runAts, delays, traces}
}

// The fates of a start in a group (harvest_start_group).
const (
	outcomeNew      = "new"
	outcomeExisting = "existing"
	outcomeMoved    = "moved"
	outcomeSkipped  = "skipped"
	outcomeRefused  = "refused"
	outcomeLease    = "lease"
	outcomeError    = "error"
)

// startedRow is one row of RunStartGroup: what became of one start.
type startedRow struct {
	ord     int32
	outcome string
	// reason is why the rule refused it (tenantcap's Reason names, or
	// 'closed').
	reason        string
	pk, taskID    int64
	due, busy     bool
	own, shard    int64 // the tenant's and the shard's counts before it
	lease         int64 // the shard's capacity lease
	scheduled     int64 // the tenant's runs not due yet with it (0: it is due)
	movedTo       int32
	errCode       string
	errMessage    string
	errConstraint string
	createdAt     time.Time
}

// scan reads one row of RunStartGroup.
func (r *startedRow) scan(rows pgx.Rows) error {
	var (
		reason, code, msg, constraint *string
		pk, task, own, shard          *int64
		lease, scheduled              *int64
		due, busy                     *bool
		moved                         *int32
	)
	err := rows.Scan(&r.ord, &r.outcome, &reason, &pk, &task, &due, &busy, &own, &shard, &lease, &scheduled,
		&moved, &code, &msg, &constraint, &r.createdAt)
	if err != nil {
		return fmt.Errorf("runstore: start group: %w", err)
	}
	r.reason, r.errCode, r.errMessage, r.errConstraint = deref(reason), deref(code), deref(msg), deref(constraint)
	r.pk, r.taskID, r.own, r.shard = deref(pk), deref(task), deref(own), deref(shard)
	r.lease, r.scheduled, r.due, r.busy, r.movedTo = deref(lease), deref(scheduled), deref(due), deref(busy), deref(moved)
	return nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// result is the answer to the start of a new run: the run as stored, and
// the counts it was admitted with (its own included).
func (r *startedRow) result(it *pending, shard int) StartResult {
	req := &it.p.Req
	return StartResult{
		Run: api.Run{
			ID: req.ID, Tenant: it.p.Tenant, Name: req.Name, Queue: req.Queue, Shard: shard,
			FairnessKey: it.row.key, QuotaKey: it.row.quota, Priority: req.Priority,
			Status: api.StatusQueued, CreatedAt: api.Time{Time: r.createdAt},
		},
		Created:      true,
		TaskID:       r.taskID,
		QueueBusy:    r.busy,
		Running:      int(r.own) + 1,
		ShardRunning: int(r.shard) + 1,
		ShardLease:   int(r.lease),
		Scheduled:    int(r.scheduled),
	}
}

// decision is the refusal of a start the statement refused by rule, in
// tenantcap's words: its 429's message names the limit and the counts.
func (r *startedRow) decision(rule tenantcap.Rule, tenant string) tenantcap.Decision {
	d, _ := rule.Judge(tenant, int(r.shard), int(r.own), int(r.lease), int(r.scheduled))
	if d.Admit || string(d.Reason) != r.reason {
		// The statement and Judge disagree, which their property test
		// rules out: the statement's decision stands, it is what was
		// written.
		d.Admit, d.Reason, d.RetryAfter = false, tenantcap.Reason(r.reason), rule.RetryAfter
	}
	return d
}

// quotaKey is the quota key a run stores: the request's, or empty.
func quotaKey(r *api.StartRequest) string {
	if r.QuotaKey != nil {
		return *r.QuotaKey
	}
	return ""
}

// scanStarted reads RunStart's row; found is false when the id existed.
func scanStarted(row pgx.Row, shard int) (StartResult, bool, error) {
	var (
		res     StartResult
		pk      int64
		status  string
		created time.Time
		run     = &res.Run
	)
	err := row.Scan(&pk, &run.ID, &run.Tenant, &run.Name, &run.Queue, &run.FairnessKey, &run.QuotaKey,
		&run.Priority, &status, &run.Attempts, &created, &res.TaskID, &res.QueueBusy, &res.Running, &res.ShardRunning, &res.ShardLease,
		&res.Scheduled)
	if errors.Is(err, pgx.ErrNoRows) {
		return StartResult{}, false, nil
	}
	if err != nil {
		return StartResult{}, false, fmt.Errorf("runstore: start run: %w", err)
	}
	run.Shard = shard
	run.Status = api.Status(status)
	run.CreatedAt = api.Time{Time: created}
	res.Created = true
	return res, true, nil
}

// replay answers a start whose id exists: the existing run when the
// request is the same, ErrConflict when it differs.
func replay(ctx context.Context, db claim.DB, p *StartParams, hash []byte) (StartResult, error) {
	existing, stored, err := get(ctx, db, p.Tenant, p.Req.ID, p.Shard)
	if err != nil {
		return StartResult{}, err
	}
	if !bytes.Equal(stored, hash) {
		return StartResult{Run: existing}, ErrConflict
	}
	return StartResult{Run: existing}, nil
}

// Existing answers starts from the runs their ids name on db, in one
// read: out[i] is a replay of ps[i] (Created false), or has Err
// ErrConflict when the request differs; found[i] is false when db holds no
// run by that id. The gateway asks a moving tenant's old home this before
// it writes the starts on the new one, so a start sent again during a
// move never makes a second run.
func Existing(ctx context.Context, db claim.DB, ps []StartParams) (out []StartOutcome, found []bool, err error) {
	out, found = make([]StartOutcome, len(ps)), make([]bool, len(ps))
	if len(ps) == 0 {
		return out, found, nil
	}
	tenants, ids := make([]string, len(ps)), make([]string, len(ps))
	for i, p := range ps {
		tenants[i], ids[i] = p.Tenant, p.Req.ID
	}
	rows, err := db.Query(ctx, sqlRunGetManyHashed, tenants, ids)
	if err != nil {
		return nil, nil, fmt.Errorf("runstore: read runs: %w", err)
	}
	defer rows.Close()
	type stored struct {
		run  api.Run
		hash []byte
	}
	held := map[[2]string]stored{}
	for rows.Next() {
		var hash []byte
		run, _, err := scanRun(rows, ps[0].Shard, &hash)
		if err != nil {
			return nil, nil, err
		}
		held[[2]string{run.Tenant, run.ID}] = stored{run, hash}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("runstore: read runs: %w", err)
	}
	for i := range ps {
		st, ok := held[[2]string{ps[i].Tenant, ps[i].Req.ID}]
		if !ok {
			continue
		}
		found[i] = true
		want, err := RequestHash(&ps[i].Req)
		if err != nil {
			return nil, nil, err
		}
		out[i].Result.Run = st.run
		if !bytes.Equal(st.hash, want) {
			out[i].Err = ErrConflict
		}
	}
	return out, found, nil
}

// Get reads the tenant's run; ErrNotFound when the tenant has none by that
// id (another tenant's run is not found either).
func Get(ctx context.Context, db claim.DB, tenant, id string, shard int) (api.Run, error) {
	run, _, err := get(ctx, db, tenant, id, shard)
	return run, err
}

func get(ctx context.Context, db claim.DB, tenant, id string, shard int) (api.Run, []byte, error) {
	var hash []byte
	run, _, err := scanRun(db.QueryRow(ctx, sqlRunGet, tenant, id), shard, &hash)
	if err != nil {
		return api.Run{}, nil, err
	}
	return run, hash, nil
}

// RequestHash identifies a start request apart from its id: two requests
// with the same hash are the same start. The input is compared as JSON
// values, so white space and key order do not matter.
func RequestHash(r *api.StartRequest) ([]byte, error) {
	c := *r
	c.ID = ""
	if len(c.Input) > 0 {
		canon, err := canonicalJSON(c.Input)
		if err != nil {
			return nil, fmt.Errorf("runstore: input: %w", err)
		}
		c.Input = canon
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("runstore: hash request: %w", err)
	}
	sum := sha256.Sum256(b)
	return sum[:], nil
}

// canonicalJSON re-encodes a JSON value with sorted object keys and exact
// numbers.
func canonicalJSON(raw json.RawMessage) (json.RawMessage, error) {
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}
