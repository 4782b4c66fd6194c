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

	"github.com/harvest-run/harvest/internal/pgrow"
	"github.com/harvest-run/harvest/internal/sqlfile"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/shard"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

var (
	sqlRunStart      = sqlfile.Must(sqlFiles, "RunStart")
	sqlRunStartGroup = sqlfile.Must(sqlFiles, "RunStartGroup")
	sqlRunStartFlush = sqlfile.Must(sqlFiles, "RunStartFlush")
	sqlRunGet        = sqlfile.Must(sqlFiles, "RunGet")
	sqlRunList       = sqlfile.Must(sqlFiles, "RunList")
	sqlRunCancel     = sqlfile.Must(sqlFiles, "RunCancel")

	sqlRunGetManyHashed = sqlfile.Must(sqlFiles, "RunGetManyHashed")

	sqlTenantRunningLock = sqlfile.Must(sqlFiles, "TenantRunningLock")
)

// ErrConflict means a run with the same id exists but was started with a
// different request.
var ErrConflict = errors.New("runstore: a run with this id exists with a different request")

// ErrNotFound means the tenant has no run with that id.
var ErrNotFound = errors.New("runstore: run not found")

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
func Start(ctx context.Context, db shard.Beginner, p StartParams) (StartResult, error) {
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
	res, found, err := startNew(ctx, tx, &row, p.Shard)
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
	fired, notify                       bool
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
		notify: r.Notify,
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
		r.maxAttempts, r.timeoutMS, r.runAt, r.delayUS, r.trace, r.fired, r.notify}
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

// startedRow is one row of RunStartGroup: what became of one start. The
// statement answers zero (not NULL) for what does not apply to a start.
type startedRow struct {
	Ord     int32  `db:"ord"`
	Outcome string `db:"outcome"`
	// Reason is why the rule refused it (tenantcap's Reason names, or
	// 'closed').
	Reason        string    `db:"reason"`
	PK            int64     `db:"run_pk"`
	TaskID        int64     `db:"task_id"`
	Due           bool      `db:"due"`
	Busy          bool      `db:"busy"`
	Own           int64     `db:"own"`       // the tenant's count before it
	Shard         int64     `db:"shard"`     // the shard's count before it
	Lease         int64     `db:"lease"`     // the shard's capacity lease
	Scheduled     int64     `db:"scheduled"` // the tenant's runs not due yet with it (0: it is due)
	MovedTo       int32     `db:"moved_to"`
	ErrCode       string    `db:"err_code"`
	ErrMessage    string    `db:"err_message"`
	ErrConstraint string    `db:"err_constraint"`
	CreatedAt     time.Time `db:"created_at"`
}

// result is the answer to the start of a new run: the run as stored, and
// the counts it was admitted with (its own included).
func (r *startedRow) result(it *pending, shard int) StartResult {
	req := &it.p.Req
	return StartResult{
		Run: api.Run{
			ID: req.ID, Tenant: it.p.Tenant, Name: req.Name, Queue: req.Queue, Shard: shard,
			FairnessKey: it.row.key, QuotaKey: it.row.quota, Priority: req.Priority,
			Status: api.StatusQueued, CreatedAt: api.Time{Time: r.CreatedAt},
		},
		Created:      true,
		TaskID:       r.TaskID,
		QueueBusy:    r.Busy,
		Running:      int(r.Own) + 1,
		ShardRunning: int(r.Shard) + 1,
		ShardLease:   int(r.Lease),
		Scheduled:    int(r.Scheduled),
	}
}

// decision is the refusal of a start the statement refused by rule, in
// tenantcap's words: its 429's message names the limit and the counts.
func (r *startedRow) decision(rule tenantcap.Rule, tenant string) tenantcap.Decision {
	d, _ := rule.Judge(tenant, int(r.Shard), int(r.Own), int(r.Lease), int(r.Scheduled))
	if d.Admit || string(d.Reason) != r.Reason {
		// The statement and Judge disagree, which their property test
		// rules out: the statement's decision stands, it is what was
		// written.
		d.Admit, d.Reason, d.RetryAfter = false, tenantcap.Reason(r.Reason), rule.RetryAfter
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

// startedRunRow is RunStart's row: the new run and what its start counted.
type startedRunRow struct {
	RunRow
	TaskID       int64 `db:"task_id"`
	QueueBusy    bool  `db:"queue_busy"`
	Running      int   `db:"running"`
	ShardRunning int   `db:"shard_running"`
	ShardLease   int   `db:"shard_lease"`
	Scheduled    int   `db:"scheduled"`
}

// startNew runs RunStart; found is false when the id existed.
func startNew(ctx context.Context, tx pgx.Tx, row *startRow, shard int) (StartResult, bool, error) {
	r, err := pgrow.One[startedRunRow](ctx, tx, sqlRunStart, row.args()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return StartResult{}, false, nil
	}
	if err != nil {
		return StartResult{}, false, fmt.Errorf("runstore: start run: %w", err)
	}
	return StartResult{
		Run: r.Run(shard), Created: true, TaskID: r.TaskID, QueueBusy: r.QueueBusy,
		Running: r.Running, ShardRunning: r.ShardRunning, ShardLease: r.ShardLease, Scheduled: r.Scheduled,
	}, true, nil
}

// replay answers a start whose id exists: the existing run when the
// request is the same, ErrConflict when it differs.
func replay(ctx context.Context, db shard.Querier, p *StartParams, hash []byte) (StartResult, error) {
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
func Existing(ctx context.Context, db shard.Querier, ps []StartParams) (out []StartOutcome, found []bool, err error) {
	out, found = make([]StartOutcome, len(ps)), make([]bool, len(ps))
	if len(ps) == 0 {
		return out, found, nil
	}
	tenants, ids := make([]string, len(ps)), make([]string, len(ps))
	for i, p := range ps {
		tenants[i], ids[i] = p.Tenant, p.Req.ID
	}
	got, err := pgrow.All[hashedRow](ctx, db, sqlRunGetManyHashed, tenants, ids)
	if err != nil {
		return nil, nil, fmt.Errorf("runstore: read runs: %w", err)
	}
	held := map[[2]string]hashedRow{}
	for _, r := range got {
		held[[2]string{r.Tenant, r.ID}] = r
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
		out[i].Result.Run = st.Run(ps[i].Shard)
		if !bytes.Equal(st.RequestHash, want) {
			out[i].Err = ErrConflict
		}
	}
	return out, found, nil
}

// Get reads the tenant's run; ErrNotFound when the tenant has none by that
// id (another tenant's run is not found either).
func Get(ctx context.Context, db shard.Querier, tenant, id string, shard int) (api.Run, error) {
	run, _, err := get(ctx, db, tenant, id, shard)
	return run, err
}

func get(ctx context.Context, db shard.Querier, tenant, id string, shard int) (api.Run, []byte, error) {
	r, err := pgrow.One[hashedRow](ctx, db, sqlRunGet, tenant, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return api.Run{}, nil, ErrNotFound
	}
	if err != nil {
		return api.Run{}, nil, fmt.Errorf("runstore: read run: %w", err)
	}
	return r.Run(shard), r.RequestHash, nil
}

// RequestHash identifies a start request apart from its id: two requests
// with the same hash are the same start. The input is compared as JSON
// values, so white space and key order do not matter.
//
// Notify is left out: it says who hears of the run, not what the run is,
// so a replay that asks for the announcement (or does not) is the same
// start, answered with the run as it was created.
func RequestHash(r *api.StartRequest) ([]byte, error) {
	c := *r
	c.ID = ""
	c.Notify = false
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
