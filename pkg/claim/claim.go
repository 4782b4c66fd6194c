package claim

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/harvest-run/harvest/internal/sqlfile"
	"github.com/harvest-run/harvest/pkg/fairkeys"
	"github.com/harvest-run/harvest/pkg/shard"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

var (
	sqlTaskClaim         = sqlfile.Must(sqlFiles, "TaskClaim")
	sqlTaskClaimBatch    = sqlfile.Must(sqlFiles, "TaskClaimBatch")
	sqlTaskEnqueue       = sqlfile.Must(sqlFiles, "TaskEnqueue")
	sqlTaskComplete      = sqlfile.Must(sqlFiles, "TaskComplete")
	sqlTaskFail          = sqlfile.Must(sqlFiles, "TaskFail")
	sqlTaskHeartbeat     = sqlfile.Must(sqlFiles, "TaskHeartbeat")
	sqlTaskContinue      = sqlfile.Must(sqlFiles, "TaskContinue")
	sqlTaskRescueExpired = sqlfile.Must(sqlFiles, "TaskRescueExpired")
	sqlTaskPromoteDue    = sqlfile.Must(sqlFiles, "TaskPromoteDue")
	sqlFairStatePrune    = sqlfile.Must(sqlFiles, "FairStatePrune")
	sqlFairStateList     = sqlfile.Must(sqlFiles, "FairStateList")
	sqlFairStateRepair   = sqlfile.Must(sqlFiles, "FairStateRepair")
	sqlFairQueues        = sqlfile.Must(sqlFiles, "FairQueues")
	sqlTaskQueues        = sqlfile.Must(sqlFiles, "TaskQueues")
	sqlWalFlush          = sqlfile.Must(sqlFiles, "WalFlush")
)

// DefaultLease is the lease of a claim whose request names none.
const DefaultLease = 30 * time.Second

// MaxRefusals bounds the rechecks that may refuse rows within one claim.
const MaxRefusals = 8

// Reasons a claim comes back without a task.
const (
	EmptyNoTask  = "no_task" // nothing pending and due (or all of it held by other claimers)
	EmptyRefused = "refused" // the rechecks refused every row tried
)

// Reasons a recheck refuses a row.
const (
	ReasonConcurrencyCap = "concurrency_cap"
	ReasonRateLimit      = "rate_limit"
)

// Request describes one claim.
type Request struct {
	Queue  string
	Worker string // the claiming worker; rows pinned to it come first
	// Now is the time the claim sorts and charges with (due times, ageing,
	// rate buckets, charged_at). Zero means the database clock. Leases
	// always use the database clock.
	Now       time.Time
	Fair      bool          // claim in weighted fair order of the fairness keys (start-time fair queuing)
	AgingSecs int           // > 0: one priority level per AgingSecs waited
	Lease     time.Duration // zero: DefaultLease
	// Shallow tells ClaimBatch that only a few rows are expected to wait
	// (the caller's last batch of the queue came back short). A fair batch
	// then takes its first ShallowSingles rows by single claims before it
	// plans in bulk: a bulk plan costs about as much as three single
	// claims whatever it finds, so for a row or two it is the dearer way.
	// The rows taken, their order and their charges are the same either
	// way; only the cost differs. Claim and ordinary batches ignore it.
	Shallow bool
}

// ShallowSingles is how many rows a fair batch takes by single claims
// before its first bulk step when the request is Shallow: about where a
// bulk step starts to cost less than single claims (docs/benchmarks.md,
// "Batches that find a row or two").
const ShallowSingles = 3

// Task is a claimed task.
type Task struct {
	ID             int64
	RunPK          int64
	Queue          string
	Key            string // fairness key ("" is the default key)
	QuotaKey       string
	Priority       int
	Continuation   bool
	DueAt          time.Time
	StickyWorker   string
	StickyUntil    time.Time
	Step           int
	Input          json.RawMessage
	Attempt        int // claims of this task so far, this one included
	LeaseToken     uuid.UUID
	LeaseExpiresAt time.Time
	TraceContext   json.RawMessage

	// The task's run: the claim statement reads these with the task (it
	// does not write the run row), so a worker reads nothing after a claim.
	Tenant   string
	RunID    string // the run's id, unique per tenant
	Workflow string // the run's name, which chooses the handler
	// RunStatus is the run's status as the claim sees it: "running" for a
	// run that is not final, or a final status when the run was cancelled
	// while its task waited (the worker retires the task).
	RunStatus   string
	MaxAttempts int
	Timeout     time.Duration // the run's attempt timeout; zero: none set
}

// Refusal is one row a recheck gave back during a claim: the model's
// (fairkeys.Refusal), so the claim and its reference model compare
// directly.
type Refusal = fairkeys.Refusal

// Result is the outcome of a claim. With OK false, Empty says why
// (EmptyNoTask or EmptyRefused) and Refused lists the refusals.
type Result struct {
	Task    Task
	OK      bool
	Lag     float64 // the claimed key's lag before the charge (fair claims)
	Refused []Refusal
	Empty   string
}

func (r Request) args() (now any, lease int64) {
	if !r.Now.IsZero() {
		now = r.Now
	}
	l := r.Lease
	if l <= 0 {
		l = DefaultLease
	}
	return now, l.Microseconds()
}

func (r Request) validate() error {
	if r.Queue == "" {
		return errors.New("claim: empty queue name")
	}
	if r.AgingSecs < 0 {
		return errors.New("claim: negative ageing")
	}
	return nil
}

// Claim takes one task from req.Queue: the fair claim when req.Fair is set,
// the ordinary claim otherwise. It is one statement; run it on a pool (it
// commits at once) or in a transaction of your own.
//
// The fair claims of a queue take turns on the queue's fair lock, so each
// one sees every charge committed before it and they follow the fair order
// exactly, whatever the number of claimers. On a pool or connection the
// claim commits without waiting for the WAL flush, which frees the lock
// for the next claimer at once, and then waits for a flush in a statement
// of its own before it returns the task (docs/claim.md, "Why a claim waits
// for its flush"). In a caller's transaction the lock is held until that
// transaction ends: keep such transactions short.
func Claim(ctx context.Context, db shard.Querier, req Request) (Result, error) {
	if err := req.validate(); err != nil {
		return Result{}, err
	}
	now, lease := req.args()
	return claimOne(ctx, db, "claim", req, now, lease, nil)
}

// ClaimByID takes the named task if it is still pending and due in
// req.Queue (the dispatch channel), runs the rechecks and, when req.Fair is
// set, charges its key. A row that is gone, not due, or held by another
// claimer gives EmptyNoTask.
func ClaimByID(ctx context.Context, db shard.Querier, id int64, req Request) (Result, error) {
	if err := req.validate(); err != nil {
		return Result{}, err
	}
	now, lease := req.args()
	return claimOne(ctx, db, "claim by id", req, now, lease, id)
}

// releaseEarly reports whether a fair claim on db may commit before its WAL
// flush: only when it runs in a transaction of its own.
func releaseEarly(db shard.Querier, fair bool) bool {
	_, inTx := db.(pgx.Tx)
	return fair && !inTx
}

// claimRows runs one claim statement and hands each of its rows to each.
// With early set it sends, in one round trip, the statement in a
// transaction of its own that commits without waiting for the WAL flush
// (the claim function turns synchronous_commit off, which frees the queue's
// fair lock at once), and then a statement that waits for the flush when
// the claim took a task (WalFlush): rows are only handed back once they
// are durable.
//
// committed, when set, is called once the claim's transaction has
// committed and so released the queue's fair lock, before the wait for the
// flush: a caller that takes turns on the lock (Claimer) may start the next
// claim meanwhile.
func claimRows(ctx context.Context, db shard.Querier, early bool, sql string, args []any, each func(pgx.CollectableRow) error,
	committed func()) error {
	if !early {
		rows, err := db.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		err = scanEach(rows, each)
		if err == nil && committed != nil {
			committed()
		}
		return err
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(sql, args...)
	b.Queue("COMMIT")
	b.Queue(sqlWalFlush)
	br := db.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return err
	}
	rows, err := br.Query()
	if err == nil {
		err = scanEach(rows, each)
	}
	if err != nil {
		br.Close()
		return err
	}
	if _, err := br.Exec(); err != nil {
		br.Close()
		return err
	}
	if committed != nil {
		committed()
	}
	if _, err := br.Exec(); err != nil {
		br.Close()
		return fmt.Errorf("wait for the claim to be durable: %w", err)
	}
	return br.Close()
}

func scanEach(rows pgx.Rows, each func(pgx.CollectableRow) error) error {
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// retries is how many times a claim statement is sent: a deadlock (the
// statement had no effect) is sent again on a pool or connection, never
// inside the caller's transaction, which the deadlock aborted.
func retries(db shard.Querier) int {
	if _, inTx := db.(pgx.Tx); inTx {
		return 1
	}
	return 3
}

// claimOne runs one claim statement.
func claimOne(ctx context.Context, db shard.Querier, op string, req Request, now any, lease int64, id any) (Result, error) {
	var (
		res Result
		err error
	)
	early := releaseEarly(db, req.Fair)
	args := []any{req.Queue, req.Worker, now, req.Fair, req.AgingSecs, lease, id, early}
	for range retries(db) {
		res = Result{}
		err = claimRows(ctx, db, early, sqlTaskClaim, args, func(row pgx.CollectableRow) error {
			var err error
			res, err = scanClaimed(row)
			return err
		}, nil)
		err = mapError(op, err)
		if !errors.Is(err, ErrDeadlock) {
			break
		}
	}
	return res, err
}

// ClaimBatch takes up to n tasks from req.Queue in one statement, each in
// the order the single claim would take them; a fair batch charges the key
// of every row taken. It returns the tasks taken and, when it stopped
// because the rechecks refused the rest, those refusals. A fair batch is
// one turn on the queue's fair lock (see Claim).
func ClaimBatch(ctx context.Context, db shard.Querier, req Request, n int) ([]Result, error) {
	return claimBatch(ctx, db, req, n, nil)
}

// claimBatch is ClaimBatch with the hook of claimRows.
func claimBatch(ctx context.Context, db shard.Querier, req Request, n int, committed func()) ([]Result, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, nil
	}
	now, lease := req.args()
	early := releaseEarly(db, req.Fair)
	singles := 0
	if req.Shallow {
		singles = ShallowSingles
	}
	args := []any{req.Queue, req.Worker, now, req.Fair, req.AgingSecs, lease, n, early, singles}
	var (
		out    []Result
		err    error
		tries  = retries(db)
		resent int
	)
	for {
		out = make([]Result, 0, n)
		err = claimRows(ctx, db, early, sqlTaskClaimBatch, args, func(row pgx.CollectableRow) error {
			r, err := scanClaimed(row)
			out = append(out, r)
			return err
		}, committed)
		err = mapError("claim batch", err)
		switch {
		case errors.Is(err, ErrDeadlock) && tries > 1:
			tries--
		case err == nil && again(out) && resent < maxAgain:
			// The queue stopped being a single key's while the batch
			// waited for the shared lock; it took nothing.
			resent++
		default:
			if err != nil {
				return nil, err
			}
			if again(out) {
				return nil, nil
			}
			return out, nil
		}
	}
}

// emptyAgain is the outcome of a lone-key batch that found, once it held
// the queue's lock in shared mode, that the queue needs the exclusive lock
// after all (harvest_claim_batch.sql). It took nothing; the batch is sent
// again, up to maxAgain times, then counts as empty.
const (
	emptyAgain = "again"
	maxAgain   = 8
)

func again(out []Result) bool {
	return len(out) == 1 && out[0].Empty == emptyAgain
}

// claimedRow is a row of the claim statements (the SQL type
// harvest_claimed), scanned by column name. A row without a task sets
// only outcome and refusals.
type claimedRow struct {
	Outcome        string             `db:"outcome"`
	Lag            pgtype.Float8      `db:"lag"`
	Refusals       []byte             `db:"refusals"`
	ID             pgtype.Int8        `db:"id"`
	RunPK          pgtype.Int8        `db:"run_pk"`
	Queue          pgtype.Text        `db:"queue"`
	Key            pgtype.Text        `db:"fairness_key"`
	QuotaKey       pgtype.Text        `db:"quota_key"`
	Priority       pgtype.Int4        `db:"priority"`
	Continuation   pgtype.Bool        `db:"continuation"`
	DueAt          pgtype.Timestamptz `db:"due_at"`
	StickyWorker   pgtype.Text        `db:"sticky_worker"`
	StickyUntil    pgtype.Timestamptz `db:"sticky_until"`
	Step           pgtype.Int4        `db:"step"`
	Input          []byte             `db:"input"`
	Attempt        pgtype.Int4        `db:"attempt"`
	LeaseToken     pgtype.UUID        `db:"lease_token"`
	LeaseExpiresAt pgtype.Timestamptz `db:"lease_expires_at"`
	TraceContext   []byte             `db:"trace_context"`
	Tenant         pgtype.Text        `db:"tenant"`
	RunID          pgtype.Text        `db:"run_id"`
	Workflow       pgtype.Text        `db:"workflow"`
	RunStatus      pgtype.Text        `db:"run_status"`
	MaxAttempts    pgtype.Int4        `db:"max_attempts"`
	TimeoutMS      pgtype.Int8        `db:"timeout_ms"`
}

func scanClaimed(row pgx.CollectableRow) (Result, error) {
	c, err := pgx.RowToStructByName[claimedRow](row)
	if err != nil {
		return Result{}, err
	}
	var res Result
	if len(c.Refusals) > 0 {
		if err := json.Unmarshal(c.Refusals, &res.Refused); err != nil {
			return Result{}, fmt.Errorf("decode refusals: %w", err)
		}
		if len(res.Refused) == 0 {
			res.Refused = nil
		}
	}
	if c.Outcome != "ok" {
		res.Empty = c.Outcome
		return res, nil
	}
	res.OK = true
	res.Lag = c.Lag.Float64
	res.Task = Task{
		ID:             c.ID.Int64,
		RunPK:          c.RunPK.Int64,
		Queue:          c.Queue.String,
		Key:            c.Key.String,
		QuotaKey:       c.QuotaKey.String,
		Priority:       int(c.Priority.Int32),
		Continuation:   c.Continuation.Bool,
		DueAt:          c.DueAt.Time,
		StickyWorker:   c.StickyWorker.String,
		StickyUntil:    c.StickyUntil.Time,
		Step:           int(c.Step.Int32),
		Input:          c.Input,
		Attempt:        int(c.Attempt.Int32),
		LeaseToken:     uuid.UUID(c.LeaseToken.Bytes),
		LeaseExpiresAt: c.LeaseExpiresAt.Time,
		TraceContext:   c.TraceContext,
		Tenant:         c.Tenant.String,
		RunID:          c.RunID.String,
		Workflow:       c.Workflow.String,
		RunStatus:      c.RunStatus.String,
		MaxAttempts:    int(c.MaxAttempts.Int32),
		Timeout:        time.Duration(c.TimeoutMS.Int64) * time.Millisecond,
	}
	return res, nil
}

// QueueWeight is a queue and its share of a worker's claims.
type QueueWeight struct {
	Queue  string
	Weight float64
}

// QueueOrder returns the queues in a random order where each position goes
// to a queue with probability proportional to its weight among the queues
// not yet placed (weighted sampling without replacement). Queues with a
// weight <= 0 come last, in their given order. The order depends only on
// rng, so a seeded rng gives a repeatable order.
func QueueOrder(queues []QueueWeight, rng *rand.Rand) []string {
	type keyed struct {
		q string
		k float64
		i int
	}
	ks := make([]keyed, len(queues))
	for i, q := range queues {
		k := math.Inf(-1)
		if q.Weight > 0 {
			// Efraimidis-Spirakis: larger u^(1/w) first; use the log form.
			u := rng.Float64()
			for u == 0 {
				u = rng.Float64()
			}
			k = math.Log(u) / q.Weight
		}
		ks[i] = keyed{q.Queue, k, i}
	}
	sort.SliceStable(ks, func(a, b int) bool {
		if ks[a].k != ks[b].k {
			return ks[a].k > ks[b].k
		}
		return ks[a].i < ks[b].i
	})
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = k.q
	}
	return out
}

// ClaimQueues claims from several queues: it tries one queue at a time, in
// the order QueueOrder draws, and returns the first task taken. Lags of two
// queues do not compare, so the queues are never merged into one sort.
// When every queue comes back empty, the result is EmptyRefused if any
// queue refused rows (their refusals are all listed), else EmptyNoTask.
// req.Queue is ignored.
func ClaimQueues(ctx context.Context, db shard.Querier, queues []QueueWeight, req Request, rng *rand.Rand) (Result, error) {
	out := Result{Empty: EmptyNoTask}
	for _, q := range QueueOrder(queues, rng) {
		r := req
		r.Queue = q
		res, err := Claim(ctx, db, r)
		if err != nil {
			return Result{}, err
		}
		if res.OK {
			res.Refused = append(out.Refused, res.Refused...)
			return res, nil
		}
		if len(res.Refused) > 0 {
			out.Empty = EmptyRefused
			out.Refused = append(out.Refused, res.Refused...)
		}
	}
	return out, nil
}
