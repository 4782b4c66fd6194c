package deferred

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/dberr"
	"github.com/harvest-run/harvest/internal/pgrow"
	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/internal/sqlfile"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/shard"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

var (
	sqlTenantRunningLock    = sqlfile.Must(sqlFiles, "TenantRunningLock")
	sqlTenantFence          = sqlfile.Must(sqlFiles, "TenantFence")
	sqlTenantRunningHold    = sqlfile.Must(sqlFiles, "TenantRunningHold")
	sqlTenantRunningTotal   = sqlfile.Must(sqlFiles, "TenantRunningTotal")
	sqlTenantRunningRead    = sqlfile.Must(sqlFiles, "TenantRunningRead")
	sqlTenantRunningRelease = sqlfile.Must(sqlFiles, "TenantRunningRelease")
	sqlStartHashes          = sqlfile.Must(sqlFiles, "StartHashes")
	sqlThrottleLock         = sqlfile.Must(sqlFiles, "ThrottleLock")
	sqlThrottleTryLock      = sqlfile.Must(sqlFiles, "ThrottleTryLock")
	sqlThrottleFired        = sqlfile.Must(sqlFiles, "ThrottleFired")
	sqlThrottlePendingTail  = sqlfile.Must(sqlFiles, "ThrottlePendingTail")
	sqlThrottlePendingLock  = sqlfile.Must(sqlFiles, "ThrottlePendingLock")
	sqlGroupInsert          = sqlfile.Must(sqlFiles, "GroupInsert")
	sqlGroupLockOpen        = sqlfile.Must(sqlFiles, "GroupLockOpen")
	sqlGroupLock            = sqlfile.Must(sqlFiles, "GroupLock")
	sqlGroupLockHeld        = sqlfile.Must(sqlFiles, "GroupLockHeld")
	sqlGroupDebounceJoin    = sqlfile.Must(sqlFiles, "GroupDebounceJoin")
	sqlGroupBatchJoin       = sqlfile.Must(sqlFiles, "GroupBatchJoin")
	sqlGroupSetState        = sqlfile.Must(sqlFiles, "GroupSetState")
	sqlGroupReschedule      = sqlfile.Must(sqlFiles, "GroupReschedule")
	sqlGroupDue             = sqlfile.Must(sqlFiles, "GroupDue")
	sqlGroupPrune           = sqlfile.Must(sqlFiles, "GroupPrune")
	sqlMemberInsert         = sqlfile.Must(sqlFiles, "MemberInsert")
	sqlMemberGroup          = sqlfile.Must(sqlFiles, "MemberGroup")
	sqlGroupOfRun           = sqlfile.Must(sqlFiles, "GroupOfRun")
	sqlRunDeferredInsert    = sqlfile.Must(sqlFiles, "RunDeferredInsert")
	sqlRunNotDueCount       = sqlfile.Must(sqlFiles, "RunNotDueCount")
	sqlRunDeferredUpdate    = sqlfile.Must(sqlFiles, "RunDeferredUpdate")
	sqlRunDeferredLock      = sqlfile.Must(sqlFiles, "RunDeferredLock")
	sqlRunDeferredDelete    = sqlfile.Must(sqlFiles, "RunDeferredDelete")
)

// Group states, as stored.
const (
	statePending   = "pending"
	stateFired     = "fired"
	stateCancelled = "cancelled"
)

// maxTxAttempts bounds the retries of Start when the database broke its
// transaction on purpose (deadlock, serialization failure) or a server
// that stopped being the primary refused it whole (dberr.Retryable: the
// pool has dropped that connection, so the next attempt reaches the new
// primary or fails to connect and is answered 503). Unlike the group
// commit of ordinary starts (internal/runstore, dberr.Conflict only), a
// deferred start holds no one else's start while it tries again.
const maxTxAttempts = 4

// Bounds of a debounce window, so that a steady stream of starts of one
// key can neither grow a window's member rows without end nor put its run
// off for ever.
const (
	// DefaultDebounceMaxStarts is how many starts a debounce window takes:
	// the start that brings it to this many fires the window at once, and
	// the next start of the key opens a new window (asked about like any
	// start that adds a run). It matches the largest batch.max_size.
	DefaultDebounceMaxStarts = api.MaxBatchItems
	// DebounceMaxOpen is how long a debounce window without max_wait stays
	// open at most: it fires no later than this after its first start, as
	// if it had been given the largest max_wait there is.
	DebounceMaxOpen = api.MaxDeferPeriod
)

// Params is one validated deferred start, bound to its tenant and home
// shard.
type Params struct {
	Tenant string
	Shard  int
	// Req carries its final id and sets one of throttle, debounce and
	// batch; Accept checks it (Validate and ParseDefer) again.
	Req api.StartRequest
	// TraceContext is the start span's W3C context; the fired run's task
	// carries the one of the start whose request it runs (the throttled
	// start, the last start of a debounce window, the first member of a
	// batch).
	TraceContext json.RawMessage
	// Now is the time the start is accepted at; zero means the database
	// clock. Tests pass it to control time; production leaves it zero.
	Now time.Time
	// Admitter, when set, decides every start that is not a replay (see
	// Accept); nil admits everything.
	Admitter tenantcap.Hook
	// DebounceMaxStarts is how many starts a debounce window takes before
	// the start that reaches it fires the window;
	// DefaultDebounceMaxStarts when zero (the gateway leaves it zero).
	DebounceMaxStarts int
}

// Result is what Accept did.
type Result struct {
	// Run is the answer to the start: status deferred with FiresAt and
	// RunID while it waits, or the run itself once started (a throttled
	// start under its limit, the member that filled a batch).
	Run api.Run
	// Created is false for a replay of an earlier start with the same id
	// and request (HTTP 200 rather than 201).
	Created bool
	// Started lists the runs this call started, for the caller to announce
	// (wake-ups, dispatch) once its transaction has committed.
	Started []runstore.Committed
}

// Accept takes one deferred start inside the caller's transaction (READ
// COMMITTED, on the tenant's home shard) and returns the answer to give.
// It works under a savepoint of its own: when it returns an error nothing
// it wrote remains, and the transaction is still usable.
//
// Errors: an *api.Error for a bad start (400 naming the field, such as
// throttle.limit, or name/quota_key for a batch member that does not match
// its batch) or a refusal of the Admitter (429); runstore.ErrConflict when
// the id is already used by a different request (409); anything else is a
// failure of the shard.
//
// Admission is decided here, when the start is accepted, for every start
// that is not a replay. A start that adds a run (a throttled start, the
// first start of a debounce window, the first member of a batch) is asked
// once its waiting run is counted; the waiting run counts in the tenant's
// running count from then on and the slot passes to the real run when it
// fires, so firing never asks again: a firer has no caller to answer 429
// to, and refusing there would drop an accepted start. A start that joins
// an open window or batch adds no run, and is asked the question a start
// that added one would be asked (the tenant's and the shard's counts as
// they stand, plus one) before it writes anything: a tenant at its limit
// cannot keep feeding its open windows and batches, and since nothing is
// counted for it, the count still equals the unfinished runs.
//
// The start that brings a debounce window to DebounceMaxStarts starts, or
// a batch to its max_size, fires it in this transaction (Result.Started).
func Accept(ctx context.Context, tx pgx.Tx, p Params) (Result, error) {
	if e := p.Req.Validate(); e != nil {
		return Result{}, e
	}
	spec, e := p.Req.ParseDefer()
	if e != nil {
		return Result{}, e
	}
	if p.Req.ID == "" {
		return Result{}, errors.New("deferred: start without an id")
	}
	hash, err := runstore.RequestHash(&p.Req)
	if err != nil {
		return Result{}, err
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("deferred: savepoint: %w", err)
	}
	defer sp.Rollback(ctx) //nolint:errcheck // a no-op after release

	if _, err := sp.Exec(ctx, sqlTenantRunningLock, p.Tenant); err != nil {
		return Result{}, fmt.Errorf("deferred: lock running count: %w", err)
	}
	if _, err := sp.Exec(ctx, sqlTenantFence, p.Tenant); err != nil {
		return Result{}, fmt.Errorf("deferred: %w", runstore.MovedOrErr(err))
	}
	now := p.Now
	if now.IsZero() {
		if now, err = dbNow(ctx, sp); err != nil {
			return Result{}, err
		}
	}
	a := &acceptor{p: &p, tx: sp, hash: hash, spec: spec, now: now}
	res, replayed, err := a.replay(ctx)
	if err != nil || replayed {
		if err == nil {
			err = sp.Commit(ctx)
		}
		return res, err
	}
	switch spec.Mode {
	case api.ModeThrottle:
		res, err = a.throttle(ctx)
	case api.ModeDebounce:
		res, err = a.debounce(ctx)
	default:
		res, err = a.batch(ctx)
	}
	if err != nil {
		return Result{}, err
	}
	if err := sp.Commit(ctx); err != nil {
		return Result{}, fmt.Errorf("deferred: release savepoint: %w", err)
	}
	return res, nil
}

// Start is Accept in a transaction of its own, committed before it
// returns; a transaction the database broke on purpose (deadlock,
// serialization failure) or a read-only server refused is tried again.
func Start(ctx context.Context, db shard.Beginner, p Params) (Result, error) {
	for attempt := 1; ; attempt++ {
		res, err := startOnce(ctx, db, p)
		if err == nil || !dberr.Retryable(err) || attempt == maxTxAttempts {
			return res, err
		}
	}
}

func startOnce(ctx context.Context, db shard.Beginner, p Params) (Result, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("deferred: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after commit
	res, err := Accept(ctx, tx, p)
	if err != nil {
		return Result{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Result{}, fmt.Errorf("deferred: commit: %w", err)
	}
	return res, nil
}

// acceptor carries one Accept call.
type acceptor struct {
	p    *Params
	tx   pgx.Tx
	hash []byte
	spec api.DeferSpec
	now  time.Time
}

// startHashes is what StartHashes reads: the request hash stored with the
// id as a member start and as a run, each nil when there is none.
type startHashes struct {
	Member []byte `db:"member_hash"`
	Run    []byte `db:"run_hash"`
}

// shardCounts is what TenantRunningTotal reads: the shard's count of
// unfinished runs and its capacity lease.
type shardCounts struct {
	Total int64 `db:"total"`
	Lease int64 `db:"lease"`
}

// tenantCounts is what TenantRunningRead reads: the tenant's own count
// with the shard's.
type tenantCounts struct {
	Own int64 `db:"own"`
	shardCounts
}

// replay answers a start whose id is taken: the current answer when the
// request is the same, ErrConflict when it differs.
func (a *acceptor) replay(ctx context.Context) (Result, bool, error) {
	rows, err := a.tx.Query(ctx, sqlStartHashes, a.p.Tenant, a.p.Req.ID)
	if err != nil {
		return Result{}, false, fmt.Errorf("deferred: look up id: %w", err)
	}
	hashes, err := pgx.CollectOneRow(rows, pgx.RowToStructByName[startHashes])
	if err != nil {
		return Result{}, false, fmt.Errorf("deferred: look up id: %w", err)
	}
	stored := hashes.Member
	if stored == nil {
		stored = hashes.Run
	}
	if stored == nil {
		return Result{}, false, nil
	}
	cur, err := Get(ctx, a.tx, a.p.Tenant, a.p.Req.ID, a.p.Shard)
	if err != nil {
		return Result{}, true, err
	}
	if string(stored) != string(a.hash) {
		return Result{Run: cur}, true, runstore.ErrConflict
	}
	return Result{Run: cur}, true, nil
}

// admit asks the Admitter about a start that adds a run; running is the
// tenant's count including it. waiting says the run is a placeholder that
// waits for its start to fire (written already): one of the tenant's runs
// not due yet, whose number admission bounds, counted here under the
// tenant's locked count row, so exactly.
func (a *acceptor) admit(ctx context.Context, running int, waiting bool) error {
	if a.p.Admitter == nil {
		return nil
	}
	var notDue int64
	c, err := pgrow.One[shardCounts](ctx, a.tx, sqlTenantRunningTotal)
	if err != nil {
		return fmt.Errorf("deferred: read the shard's running count: %w", err)
	}
	if waiting {
		if err := a.tx.QueryRow(ctx, sqlRunNotDueCount, a.p.Tenant).Scan(&notDue); err != nil {
			return fmt.Errorf("deferred: count runs not due yet: %w", err)
		}
	}
	return a.p.Admitter.Admit(ctx, tenantcap.Admission{
		Shard: a.p.Shard, Tenant: a.p.Tenant, Running: running, ShardRunning: int(c.Total),
		ShardLease: int(c.Lease), Scheduled: int(notDue), Req: &a.p.Req,
	})
}

// admitJoin asks the Admitter about a start that joins an open debounce
// window or batch, before it writes anything. It is judged as a start that
// adds a run would be at this moment (the counts as they stand plus this
// start), so it is refused exactly when an ordinary start of the tenant
// would be; but nothing is counted for it, as its window's run already
// is. Counting each member instead would make the tenant's count exceed
// its unfinished runs (and the recount would take the slots back), and
// would cost a window as many slots as it has starts.
func (a *acceptor) admitJoin(ctx context.Context) error {
	if a.p.Admitter == nil {
		return nil
	}
	c, err := pgrow.One[tenantCounts](ctx, a.tx, sqlTenantRunningRead, a.p.Tenant)
	if err != nil {
		return fmt.Errorf("deferred: read running counts: %w", err)
	}
	return a.p.Admitter.Admit(ctx, tenantcap.Admission{
		Shard: a.p.Shard, Tenant: a.p.Tenant, Running: int(c.Own) + 1, ShardRunning: int(c.Total) + 1,
		ShardLease: int(c.Lease), Req: &a.p.Req,
	})
}

// runRequest is the request the fired run of a debounce window or batch is
// started with: the start's, without its id and its deferral.
func runRequest(r api.StartRequest) api.StartRequest {
	r.ID = ""
	r.Throttle, r.Debounce, r.Batch = nil, nil, nil
	return r
}

// throttle accepts a throttled start: it starts at once when its key is
// under its limit and nothing of the key waits; otherwise it waits for the
// slot the limit gives it, behind the key's earlier starts.
func (a *acceptor) throttle(ctx context.Context) (Result, error) {
	ts := a.spec.Throttle
	p := a.p
	if _, err := a.tx.Exec(ctx, sqlThrottleLock, p.Tenant, p.Req.Queue, ts.Key); err != nil {
		return Result{}, fmt.Errorf("deferred: lock throttle key: %w", err)
	}
	period := time.Duration(ts.Period)
	fired, err := collectTimes(ctx, a.tx, sqlThrottleFired, p.Tenant, p.Req.Queue, ts.Key, a.now, period.Microseconds(), ts.Limit)
	if err != nil {
		return Result{}, err
	}
	waiting, err := collectTimes(ctx, a.tx, sqlThrottlePendingTail, p.Tenant, p.Req.Queue, ts.Key, ts.Limit)
	if err != nil {
		return Result{}, err
	}
	seq := append(reversed(fired), reversed(waiting)...)
	slot := nextSlot(seq, ts.Limit, period, a.now)
	request, err := json.Marshal(withoutID(p.Req))
	if err != nil {
		return Result{}, fmt.Errorf("deferred: encode request: %w", err)
	}
	if len(waiting) == 0 && !slot.After(a.now) {
		// Under the limit: an ordinary start, remembered in the key's window.
		sp := runstore.StartParams{Tenant: p.Tenant, Shard: p.Shard, Req: p.Req, TraceContext: p.TraceContext}
		res, err := runstore.StartTx(ctx, a.tx, sp)
		if err != nil || !res.Created {
			return Result{Run: res.Run}, err
		}
		if _, err := a.tx.Exec(ctx, sqlGroupInsert, p.Tenant, p.Req.ID, string(api.ModeThrottle), p.Req.Queue, ts.Key,
			stateFired, a.now, nil, ts.Limit, period.Microseconds(), nil, request, nil, jsonArg(p.TraceContext), a.now); err != nil {
			return Result{}, fmt.Errorf("deferred: record throttled run: %w", err)
		}
		if err := a.admit(ctx, res.Running, false); err != nil {
			return Result{}, err
		}
		res.Run.RunID, res.Run.DeferMode = p.Req.ID, api.ModeThrottle
		return Result{Run: res.Run, Created: true, Started: []runstore.Committed{{Params: sp, Result: res}}}, nil
	}
	running, err := a.placeholder(ctx, p.Req.ID, p.Req, a.hash)
	if err != nil {
		return Result{}, err
	}
	if _, err := a.tx.Exec(ctx, sqlGroupInsert, p.Tenant, p.Req.ID, string(api.ModeThrottle), p.Req.Queue, ts.Key,
		statePending, slot, nil, ts.Limit, period.Microseconds(), nil, request, nil, jsonArg(p.TraceContext), a.now); err != nil {
		return Result{}, fmt.Errorf("deferred: queue throttled start: %w", err)
	}
	if err := a.admit(ctx, running, true); err != nil {
		return Result{}, err
	}
	run, err := Get(ctx, a.tx, p.Tenant, p.Req.ID, p.Shard)
	return Result{Run: run, Created: true}, err
}

// placeholder writes the waiting run (status deferred, no task) and counts
// it for the tenant; it returns the tenant's count including it.
func (a *acceptor) placeholder(ctx context.Context, id string, r api.StartRequest, hash []byte) (int, error) {
	cols := runArgs(a.p.Tenant, id, &r)
	args := append(append(append([]any{}, cols[:8]...), hash), cols[8:]...)
	args = append(args, r.Notify)
	var pk int64
	err := a.tx.QueryRow(ctx, sqlRunDeferredInsert, args...).Scan(&pk)
	if errors.Is(err, pgx.ErrNoRows) {
		// The caller checked the id under the tenant's lock, so only a run
		// written outside the start paths can be in the way.
		return 0, runstore.ErrConflict
	}
	if err != nil {
		return 0, fmt.Errorf("deferred: write deferred run: %w", err)
	}
	var running int
	if err := a.tx.QueryRow(ctx, sqlTenantRunningHold, a.p.Tenant).Scan(&running); err != nil {
		return 0, fmt.Errorf("deferred: count deferred run: %w", err)
	}
	return running, nil
}

// runArgs are the run columns of a request: tenant, id, name, queue,
// fairness key, quota key, priority, input, max attempts, timeout ms.
func runArgs(tenant, id string, r *api.StartRequest) []any {
	var qk string
	if r.QuotaKey != nil {
		qk = *r.QuotaKey
	}
	maxAttempts := api.DefaultMaxAttempts
	if r.MaxAttempts != nil {
		maxAttempts = *r.MaxAttempts
	}
	var timeoutMS *int64
	if r.Timeout != nil {
		ms := max(time.Duration(*r.Timeout).Milliseconds(), 1)
		timeoutMS = &ms
	}
	return []any{tenant, id, r.Name, r.Queue, r.Key(), qk, r.Priority, jsonArg(r.Input), maxAttempts, timeoutMS}
}

// openGroup is the locked pending debounce window or batch of a key whose
// run still waits, if there is one.
type openGroup struct {
	pk      int64
	runID   string
	firesAt time.Time
	request api.StartRequest
}

// lockOpen finds and locks the key's open group. A group whose run was
// cancelled while it waited is closed on the way: the start opens a new one.
func (a *acceptor) lockOpen(ctx context.Context, key string) (*openGroup, error) {
	var (
		g        openGroup
		deadline *time.Time
		maxSize  *int
		size     int
		request  []byte
	)
	err := a.tx.QueryRow(ctx, sqlGroupLockOpen, a.p.Tenant, a.p.Req.Queue, string(a.spec.Mode), key).
		Scan(&g.pk, &g.runID, &g.firesAt, &deadline, &maxSize, &size, &request)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("deferred: lock open %s: %w", a.spec.Mode, err)
	}
	live, err := a.runWaits(ctx, g.pk, g.runID)
	if err != nil || !live {
		return nil, err
	}
	if err := json.Unmarshal(request, &g.request); err != nil {
		return nil, fmt.Errorf("deferred: decode stored request: %w", err)
	}
	return &g, nil
}

// runWaits locks a group's waiting run and reports whether it still
// waits; when it does not (it was cancelled) the group is closed.
func (a *acceptor) runWaits(ctx context.Context, groupPK int64, runID string) (bool, error) {
	_, live, err := lockWaitingRun(ctx, a.tx, a.p.Tenant, runID)
	if err != nil {
		return false, err
	}
	if !live {
		if _, err := a.tx.Exec(ctx, sqlGroupSetState, groupPK, stateCancelled, a.now); err != nil {
			return false, fmt.Errorf("deferred: close cancelled group: %w", err)
		}
	}
	return live, nil
}

// open opens a debounce window or batch for this start: a new run id, the
// waiting run, the group, and the admission of the run it will fire.
func (a *acceptor) open(ctx context.Context, key string, firesAt time.Time, deadline *time.Time, maxSize *int,
	run api.StartRequest, input any) (int64, string, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return 0, "", fmt.Errorf("deferred: make a run id: %w", err)
	}
	runID := id.String()
	run.ID = runID
	hash, err := runstore.RequestHash(&run)
	if err != nil {
		return 0, "", err
	}
	running, err := a.placeholder(ctx, runID, run, hash)
	if err != nil {
		return 0, "", err
	}
	request, err := json.Marshal(withoutID(run))
	if err != nil {
		return 0, "", fmt.Errorf("deferred: encode request: %w", err)
	}
	var pk int64
	if err := a.tx.QueryRow(ctx, sqlGroupInsert, a.p.Tenant, runID, string(a.spec.Mode), a.p.Req.Queue, key,
		statePending, firesAt, deadline, nil, nil, maxSize, request, input, jsonArg(a.p.TraceContext), a.now).Scan(&pk); err != nil {
		return 0, "", fmt.Errorf("deferred: open %s: %w", a.spec.Mode, err)
	}
	if err := a.admit(ctx, running, true); err != nil {
		return 0, "", err
	}
	return pk, runID, nil
}

// member records this start under its own id in its group.
func (a *acceptor) member(ctx context.Context, groupPK int64, position int) error {
	if _, err := a.tx.Exec(ctx, sqlMemberInsert, a.p.Tenant, a.p.Req.ID, groupPK, position, a.hash, a.now); err != nil {
		return fmt.Errorf("deferred: record start: %w", err)
	}
	return nil
}

// debounce accepts a debounced start: it opens the key's window, or joins
// the open one, replacing its request and restarting its quiet period.
// The start that brings the window to its last start (DebounceMaxStarts)
// fires it at once.
func (a *acceptor) debounce(ctx context.Context) (Result, error) {
	ds := a.spec.Debounce
	p := a.p
	g, err := a.lockOpen(ctx, ds.Key)
	if err != nil {
		return Result{}, err
	}
	quiet := a.now.Add(time.Duration(ds.Period))
	run := runRequest(p.Req)
	var position int
	if g == nil {
		// Without max_wait the window is still capped: it fires at the
		// latest DebounceMaxOpen after its first start.
		deadline := a.now.Add(DebounceMaxOpen)
		if ds.MaxWait != nil {
			deadline = a.now.Add(time.Duration(*ds.MaxWait))
		}
		pk, _, err := a.open(ctx, ds.Key, quiet, &deadline, nil, run, nil)
		if err != nil {
			return Result{}, err
		}
		g, position = &openGroup{pk: pk}, 1
	} else {
		if err := a.admitJoin(ctx); err != nil {
			return Result{}, err
		}
		request, err := json.Marshal(run)
		if err != nil {
			return Result{}, fmt.Errorf("deferred: encode request: %w", err)
		}
		if err := a.tx.QueryRow(ctx, sqlGroupDebounceJoin, g.pk, request, jsonArg(p.TraceContext), quiet,
			DebounceMaxOpen.Microseconds()).Scan(&position); err != nil {
			return Result{}, fmt.Errorf("deferred: join debounce window: %w", err)
		}
		args := runArgs(p.Tenant, g.runID, &run)
		if _, err := a.tx.Exec(ctx, sqlRunDeferredUpdate, args[0], args[1], args[2], args[4], args[5], args[6], args[7],
			args[8], args[9]); err != nil {
			return Result{}, fmt.Errorf("deferred: update deferred run: %w", err)
		}
		if err := a.notify(ctx, g.runID); err != nil {
			return Result{}, err
		}
	}
	if err := a.member(ctx, g.pk, position); err != nil {
		return Result{}, err
	}
	maxStarts := p.DebounceMaxStarts
	if maxStarts <= 0 {
		maxStarts = DefaultDebounceMaxStarts
	}
	return a.answer(ctx, g.pk, position >= maxStarts)
}

// answer is the Result of a start of a debounce window or batch, once its
// member row is written: the group's run as the start's id reads it, after
// firing the group first when full is set (the window or batch took its
// last start).
func (a *acceptor) answer(ctx context.Context, groupPK int64, full bool) (Result, error) {
	res := Result{Created: true}
	if full {
		grp, err := lockGroup(ctx, a.tx, sqlGroupLockHeld, groupPK)
		if err != nil {
			return Result{}, err
		}
		started, err := fire(ctx, a.tx, a.p.Shard, grp, a.now)
		if err != nil {
			return Result{}, err
		}
		if started != nil {
			res.Started = []runstore.Committed{*started}
		}
	}
	var err error
	res.Run, err = Get(ctx, a.tx, a.p.Tenant, a.p.Req.ID, a.p.Shard)
	return res, err
}

// batch accepts a batched start: it opens the key's batch, or joins the
// open one when it agrees with it on name and quota key (and is admitted,
// as a later start of a debounce window is); the member that fills the
// batch fires it at once.
func (a *acceptor) batch(ctx context.Context) (Result, error) {
	bs := a.spec.Batch
	p := a.p
	g, err := a.lockOpen(ctx, bs.Key)
	if err != nil {
		return Result{}, err
	}
	input := json.RawMessage("null")
	if len(p.Req.Input) > 0 {
		input = p.Req.Input
	}
	var position, maxSize int
	if g == nil {
		deadline := a.now.Add(time.Duration(bs.MaxWait))
		list, err := json.Marshal([]json.RawMessage{input})
		if err != nil {
			return Result{}, fmt.Errorf("deferred: encode input: %w", err)
		}
		run := runRequest(p.Req)
		run.Input = list
		pk, _, err := a.open(ctx, bs.Key, deadline, nil, &bs.MaxSize, run, string(list))
		if err != nil {
			return Result{}, err
		}
		g, position, maxSize = &openGroup{pk: pk}, 1, bs.MaxSize
	} else {
		if e := agree(&g.request, &p.Req); e != nil {
			return Result{}, e
		}
		if err := a.admitJoin(ctx); err != nil {
			return Result{}, err
		}
		rows, err := a.tx.Query(ctx, sqlGroupBatchJoin, g.pk, string(input))
		if err != nil {
			return Result{}, fmt.Errorf("deferred: join batch: %w", err)
		}
		joined, err := pgx.CollectOneRow(rows, pgx.RowToStructByName[batchJoined])
		if err != nil {
			return Result{}, fmt.Errorf("deferred: join batch: %w", err)
		}
		position, maxSize = joined.Size, joined.MaxSize
		if err := a.notify(ctx, g.runID); err != nil {
			return Result{}, err
		}
	}
	if err := a.member(ctx, g.pk, position); err != nil {
		return Result{}, err
	}
	return a.answer(ctx, g.pk, position >= maxSize)
}

// notify marks the group's waiting run runID as announced when it ends,
// if the start joining it asked for that: the group's one run is
// announced when any of its starts asked.
func (a *acceptor) notify(ctx context.Context, runID string) error {
	if !a.p.Req.Notify {
		return nil
	}
	if _, err := runstore.Notify(ctx, a.tx, a.p.Tenant, runID); err != nil {
		return fmt.Errorf("deferred: %w", err)
	}
	return nil
}

// batchJoined is what GroupBatchJoin reads: the batch's size with the
// start that joined it, and its bound.
type batchJoined struct {
	Size    int `db:"size"`
	MaxSize int `db:"max_size"`
}

// agree checks that a batch member matches its batch on what the one run
// of the batch has only one of.
func agree(batch, member *api.StartRequest) *api.Error {
	if batch.Name != member.Name {
		return api.Invalid("name", "name %q differs from the open batch's %q: the members of a batch start one run, so they must agree on name, queue and quota_key", member.Name, batch.Name)
	}
	if batch.Queue != member.Queue {
		return api.Invalid("queue", "queue %q differs from the open batch's %q", member.Queue, batch.Queue)
	}
	if deref(batch.QuotaKey) != deref(member.QuotaKey) {
		return api.Invalid("quota_key", "quota_key %q differs from the open batch's %q: the members of a batch start one run, so they must agree on name, queue and quota_key", deref(member.QuotaKey), deref(batch.QuotaKey))
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func withoutID(r api.StartRequest) api.StartRequest {
	r.ID = ""
	return r
}

// jsonArg passes a JSON value to a jsonb parameter; empty is SQL NULL.
func jsonArg(b json.RawMessage) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}

func dbNow(ctx context.Context, db shard.Querier) (time.Time, error) {
	var now time.Time
	if err := db.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("deferred: read the database clock: %w", err)
	}
	return now, nil
}

// collectTimes runs a query of one timestamp column.
func collectTimes(ctx context.Context, db shard.Querier, sql string, args ...any) ([]time.Time, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("deferred: read throttle window: %w", err)
	}
	ts, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	if err != nil {
		return nil, fmt.Errorf("deferred: read throttle window: %w", err)
	}
	return ts, nil
}

func reversed(ts []time.Time) []time.Time {
	out := make([]time.Time, len(ts))
	for i, t := range ts {
		out[len(ts)-1-i] = t
	}
	return out
}

// nextSlot is when the next start of a throttle key may fire: seq holds
// the fire times of the key's latest starts in order (those that fired
// inside the window, then the slots of those still waiting). With fewer
// than limit of them there is room now; otherwise the start fires one
// period after the limit-th latest, so no period-long window ever holds
// more than limit runs of the key.
func nextSlot(seq []time.Time, limit int, period time.Duration, now time.Time) time.Time {
	if len(seq) < limit {
		return now
	}
	t := seq[len(seq)-limit].Add(period)
	if t.Before(now) {
		return now
	}
	return t
}
