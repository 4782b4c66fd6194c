package deferred_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/deferred"
	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/shard"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

type bundle struct {
	t   testing.TB
	ctx context.Context
	db  *pgxpool.Pool
	// t0 is the time the tests count from; every Accept and Fire gets an
	// explicit time, so nothing depends on the wall clock.
	t0 time.Time
}

func setup(t testing.TB) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return &bundle{t: t, ctx: ctx, db: testsvc.NewDB(t), t0: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
}

// startOpts describes one start made by the factory; zero fields take the
// defaults.
type startOpts struct {
	Tenant   string        // "acme"
	ID       string        // a fresh UUID
	Name     string        // "wf"
	Queue    string        // "q"
	QuotaKey string        // none
	Input    string        // JSON; none when empty
	Throttle string        // the raw throttle object
	Debounce string        // the raw debounce object
	Batch    string        // the raw batch object
	At       time.Duration // after t0
	Admitter tenantcap.Hook
	DB       shard.Beginner // b.db
	// MaxStarts is Params.DebounceMaxStarts (the default when zero).
	MaxStarts int
	Notify    bool // announce the run's end
}

func (b *bundle) params(o startOpts) deferred.Params {
	if o.Tenant == "" {
		o.Tenant = "acme"
	}
	if o.ID == "" {
		o.ID = uuid.NewString()
	}
	if o.Name == "" {
		o.Name = "wf"
	}
	if o.Queue == "" {
		o.Queue = "q"
	}
	req := api.StartRequest{ID: o.ID, Name: o.Name, Queue: o.Queue, Notify: o.Notify}
	if o.QuotaKey != "" {
		req.QuotaKey = &o.QuotaKey
	}
	if o.Input != "" {
		req.Input = json.RawMessage(o.Input)
	}
	if o.Throttle != "" {
		req.Throttle = json.RawMessage(o.Throttle)
	}
	if o.Debounce != "" {
		req.Debounce = json.RawMessage(o.Debounce)
	}
	if o.Batch != "" {
		req.Batch = json.RawMessage(o.Batch)
	}
	return deferred.Params{Tenant: o.Tenant, Req: req, Now: b.t0.Add(o.At), Admitter: o.Admitter, DebounceMaxStarts: o.MaxStarts}
}

// try accepts a start in a transaction of its own.
func (b *bundle) try(o startOpts) (deferred.Result, error) {
	b.t.Helper()
	db := o.DB
	if db == nil {
		db = b.db
	}
	return deferred.Start(b.ctx, db, b.params(o))
}

func (b *bundle) start(o startOpts) deferred.Result {
	b.t.Helper()
	res, err := b.try(o)
	require.NoError(b.t, err)
	return res
}

func (b *bundle) fire(at time.Duration) deferred.FireReport {
	b.t.Helper()
	rep, err := deferred.Fire(b.ctx, b.db, deferred.FireOptions{Now: b.t0.Add(at)})
	require.NoError(b.t, err)
	return rep
}

func (b *bundle) get(id string) api.Run {
	b.t.Helper()
	run, err := deferred.Get(b.ctx, b.db, "acme", id, 0)
	require.NoError(b.t, err)
	return run
}

func (b *bundle) scalar(sql string, args ...any) int {
	b.t.Helper()
	var n int
	require.NoError(b.t, b.db.QueryRow(b.ctx, sql, args...).Scan(&n))
	return n
}

// runs counts the tenant's real runs (not waiting ones) and their tasks.
func (b *bundle) runs() (runs, tasks int) {
	b.t.Helper()
	return b.scalar(`SELECT count(*) FROM runs WHERE status <> 'deferred'`),
		b.scalar(`SELECT count(*) FROM tasks`)
}

// taskInput is the input of the first task of the run with that id.
func (b *bundle) taskInput(runID string) string {
	b.t.Helper()
	var in string
	require.NoError(b.t, b.db.QueryRow(b.ctx, `
		SELECT t.input::text FROM tasks t JOIN runs r ON r.pk = t.run_pk
		WHERE r.tenant = 'acme' AND r.id = $1`, runID).Scan(&in))
	return in
}

func (b *bundle) running() int {
	b.t.Helper()
	return b.scalar(`SELECT coalesce((SELECT running FROM tenant_running WHERE tenant = 'acme'), 0)`)
}

func at(b *bundle, d time.Duration) time.Time { return b.t0.Add(d) }

func TestThrottleStartsUnderTheLimitAndQueuesTheRestInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spec := `{"key": "k", "limit": 2, "period": "1m"}`
	var res []deferred.Result
	for i := range 5 {
		res = append(res, b.start(startOpts{ID: fmt.Sprint("t", i), Throttle: spec, Input: fmt.Sprint(i)}))
	}
	for i := range 2 {
		require.Equal(t, api.StatusQueued, res[i].Run.Status, "under the limit: started at once")
		require.Equal(t, fmt.Sprint("t", i), res[i].Run.ID)
		require.Len(t, res[i].Started, 1)
	}
	for i, want := range []time.Duration{time.Minute, time.Minute, 2 * time.Minute} {
		r := res[2+i].Run
		require.Equal(t, api.StatusDeferred, r.Status)
		require.Equal(t, r.ID, r.RunID, "a throttled start fires a run with its own id")
		require.Equal(t, api.ModeThrottle, r.DeferMode)
		require.NotNil(t, r.FiresAt)
		require.True(t, r.FiresAt.Equal(at(b, want)), "t%d fires at %s, want +%s", 2+i, r.FiresAt, want)
	}
	require.Equal(t, 5, b.running(), "every throttled start holds its slot")

	require.Zero(t, b.fire(59*time.Second).Fired, "the window is full")
	rep := b.fire(time.Minute)
	require.Equal(t, 2, rep.Fired)
	require.Equal(t, api.StatusQueued, b.get("t2").Status)
	require.Equal(t, api.StatusQueued, b.get("t3").Status)
	require.Equal(t, api.StatusDeferred, b.get("t4").Status)
	require.Equal(t, "3", b.taskInput("t3"))

	// A late start queues behind t4: the window holds t2, t3 (fired at +1m)
	// and t4's slot (+2m).
	late := b.start(startOpts{ID: "t5", Throttle: spec, At: 61 * time.Second})
	require.True(t, late.Run.FiresAt.Equal(at(b, 2*time.Minute)))
	require.Zero(t, b.fire(119*time.Second).Fired)
	require.Equal(t, 2, b.fire(2*time.Minute).Fired)
	runs, tasks := b.runs()
	require.Equal(t, 6, runs)
	require.Equal(t, 6, tasks)
	require.Equal(t, 6, b.running(), "firing hands the slot over, it does not add one")
	require.Zero(t, b.scalar(`SELECT count(*) FROM runs WHERE status = 'deferred'`))
	// Fairness key: the quota key or the default key.
	require.Equal(t, "", b.get("t4").FairnessKey)
}

func TestThrottleKeysAreScopedToTenantAndQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spec := `{"key": "k", "limit": 1, "period": "1h"}`
	require.Equal(t, api.StatusQueued, b.start(startOpts{Throttle: spec}).Run.Status)
	require.Equal(t, api.StatusQueued, b.start(startOpts{Throttle: spec, Queue: "other"}).Run.Status)
	require.Equal(t, api.StatusQueued, b.start(startOpts{Throttle: spec, Tenant: "globex"}).Run.Status)
	require.Equal(t, api.StatusQueued, b.start(startOpts{Throttle: `{"key": "j", "limit": 1, "period": "1h"}`}).Run.Status)
	require.Equal(t, api.StatusDeferred, b.start(startOpts{Throttle: spec}).Run.Status)
}

// A firer that was down does not release the backlog at once: the limit
// holds over the times runs really start.
func TestThrottleAfterAnOutageKeepsTheLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spec := `{"limit": 1, "period": "1m"}`
	for i := range 4 {
		b.start(startOpts{ID: fmt.Sprint("o", i), Throttle: spec})
	}
	require.True(t, b.get("o3").FiresAt.Equal(at(b, 3*time.Minute)))
	rep := b.fire(10 * time.Minute)
	require.Equal(t, 1, rep.Fired)
	require.Equal(t, api.StatusQueued, b.get("o1").Status)
	require.True(t, b.get("o2").FiresAt.Equal(at(b, 11*time.Minute)), "rescheduled behind o1's real start")
	require.True(t, b.get("o3").FiresAt.Equal(at(b, 12*time.Minute)))
	require.Zero(t, b.fire(10*time.Minute+59*time.Second).Fired)
	require.Equal(t, 1, b.fire(11*time.Minute).Fired)
	require.Equal(t, api.StatusQueued, b.get("o2").Status)
}

func TestDebounceFiresAfterTheQuietPeriodWithTheLastInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spec := `{"key": "user-1", "period": "10s", "max_wait": "30s"}`
	s1 := b.start(startOpts{ID: "s1", Debounce: spec, Input: `{"n": 1}`})
	require.Equal(t, api.StatusDeferred, s1.Run.Status)
	require.Equal(t, "s1", s1.Run.ID)
	require.NotEqual(t, "s1", s1.Run.RunID, "the window's run has a new id")
	require.True(t, s1.Run.FiresAt.Equal(at(b, 10*time.Second)))
	runID := s1.Run.RunID

	s2 := b.start(startOpts{ID: "s2", Debounce: spec, Input: `{"n": 2}`, At: 5 * time.Second})
	require.Equal(t, runID, s2.Run.RunID, "one window, one run")
	require.True(t, s2.Run.FiresAt.Equal(at(b, 15*time.Second)), "the quiet period restarts")
	require.Zero(t, b.fire(14*time.Second).Fired)
	b.start(startOpts{ID: "s3", Debounce: spec, Input: `{"n": 3}`, At: 14 * time.Second})
	s4 := b.start(startOpts{ID: "s4", Debounce: spec, Input: `{"n": 4}`, QuotaKey: "gold", At: 23 * time.Second})
	require.True(t, s4.Run.FiresAt.Equal(at(b, 30*time.Second)), "never past max_wait from the first start")
	require.Equal(t, "gold", b.get(runID).QuotaKey, "the waiting run shows the last start's request")
	require.Equal(t, 1, b.running(), "a window holds one slot")

	require.Zero(t, b.fire(29*time.Second).Fired)
	require.Equal(t, 1, b.fire(30*time.Second).Fired)
	require.JSONEq(t, `{"n": 4}`, b.taskInput(runID), "the last start's input")
	for _, id := range []string{"s1", "s2", "s3", "s4"} {
		run := b.get(id)
		require.Equal(t, id, run.ID)
		require.Equal(t, runID, run.RunID, "every start of the window resolves to its run")
		require.Equal(t, api.StatusQueued, run.Status)
		require.Nil(t, run.FiresAt)
		require.Equal(t, "gold", run.FairnessKey, "the fired run's key is its quota key")
	}
	require.Equal(t, 1, b.running())

	// The next start opens a new window.
	s5 := b.start(startOpts{ID: "s5", Debounce: spec, At: 31 * time.Second})
	require.NotEqual(t, runID, s5.Run.RunID)
	require.True(t, s5.Run.FiresAt.Equal(at(b, 41*time.Second)))
}

// The one run of a debounce window or batch is announced when any of its
// starts asked for it, the first or a later one; a throttled start's run
// when its own start did.
func TestAGroupsRunIsAnnouncedWhenAnyStartAsked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	notify := func(runID string) bool {
		var on bool
		require.NoError(t, b.db.QueryRow(b.ctx, `SELECT notify FROM runs WHERE tenant = 'acme' AND id = $1`, runID).Scan(&on))
		return on
	}
	deb := `{"key": "d", "period": "10s"}`
	quiet := b.start(startOpts{Debounce: deb}).Run.RunID
	told := b.start(startOpts{Debounce: `{"key": "e", "period": "10s"}`}).Run.RunID
	b.start(startOpts{Debounce: `{"key": "e", "period": "10s"}`, Notify: true, At: time.Second})
	bat := `{"key": "b", "max_size": 3, "max_wait": "1m"}`
	batch := b.start(startOpts{Batch: bat}).Run.RunID
	b.start(startOpts{Batch: bat, Notify: true})
	thr := `{"key": "t", "limit": 1, "period": "1m"}`
	b.start(startOpts{Throttle: thr})
	held := b.start(startOpts{Throttle: thr, Notify: true})
	require.Equal(t, api.StatusDeferred, held.Run.Status)

	require.False(t, notify(quiet))
	require.True(t, notify(told), "the waiting run takes a later start's request")
	require.True(t, notify(batch), "a batch's run, when a later member asked")
	require.Equal(t, 4, b.fire(time.Hour).Fired)
	require.False(t, notify(quiet))
	require.True(t, notify(told), "the fired run keeps it")
	require.True(t, notify(batch))
	require.True(t, notify(held.Run.RunID))
}

func TestDebounceWithoutMaxWaitWaitsForQuiet(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spec := `{"period": "10s"}`
	for i := range 10 {
		b.start(startOpts{Debounce: spec, At: time.Duration(i) * 9 * time.Second})
		require.Zero(t, b.fire(time.Duration(i)*9*time.Second+8*time.Second).Fired)
	}
	require.Equal(t, 1, b.fire(91*time.Second).Fired)
}

func TestBatchFiresAtMaxSizeWithTheInputsInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spec := `{"key": "invoices", "max_size": 3, "max_wait": "1m"}`
	m1 := b.start(startOpts{ID: "m1", Batch: spec, Input: `{"a": 1}`, QuotaKey: "acct"})
	m2 := b.start(startOpts{ID: "m2", Batch: spec, Input: `"two"`, QuotaKey: "acct", At: time.Second})
	require.Equal(t, api.StatusDeferred, m2.Run.Status)
	require.Equal(t, m1.Run.RunID, m2.Run.RunID)
	require.True(t, m2.Run.FiresAt.Equal(at(b, time.Minute)), "max_wait counts from the first member")
	m3 := b.start(startOpts{ID: "m3", Batch: spec, QuotaKey: "acct", At: 2 * time.Second})
	require.Equal(t, api.StatusQueued, m3.Run.Status, "the member that fills the batch fires it")
	require.Len(t, m3.Started, 1)
	runID := m1.Run.RunID
	require.JSONEq(t, `[{"a": 1}, "two", null]`, b.taskInput(runID))
	for _, id := range []string{"m1", "m2", "m3"} {
		run := b.get(id)
		require.Equal(t, runID, run.RunID, "every member resolves to the one run")
		require.Equal(t, api.StatusQueued, run.Status)
		require.Equal(t, "acct", run.FairnessKey)
	}
	require.Zero(t, b.fire(time.Hour).Fired, "a fired batch does not fire again")
	runs, _ := b.runs()
	require.Equal(t, 1, runs)
	require.Equal(t, 1, b.running())
}

func TestBatchFiresAtMaxWait(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spec := `{"max_size": 10, "max_wait": "30s"}`
	b.start(startOpts{ID: "a", Batch: spec, Input: `1`})
	b.start(startOpts{ID: "b", Batch: spec, Input: `2`, At: 20 * time.Second})
	require.Zero(t, b.fire(29*time.Second).Fired)
	require.Equal(t, 1, b.fire(30*time.Second).Fired)
	require.JSONEq(t, `[1, 2]`, b.taskInput(b.get("a").RunID))
	c := b.start(startOpts{ID: "c", Batch: spec, At: 31 * time.Second})
	require.NotEqual(t, b.get("a").RunID, c.Run.RunID, "a new batch")
}

func TestBatchMembersMustAgree(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spec := `{"key": "k", "max_size": 5, "max_wait": "1m"}`
	b.start(startOpts{ID: "first", Batch: spec, QuotaKey: "qk"})
	for _, c := range []struct {
		opts  startOpts
		field string
	}{
		{startOpts{ID: "x1", Batch: spec, QuotaKey: "qk", Name: "other"}, "name"},
		{startOpts{ID: "x2", Batch: spec, QuotaKey: "other"}, "quota_key"},
		{startOpts{ID: "x3", Batch: spec}, "quota_key"},
	} {
		_, err := b.try(c.opts)
		var ae *api.Error
		require.ErrorAs(t, err, &ae)
		require.Equal(t, 400, ae.Status)
		require.Equal(t, c.field, ae.Field)
	}
	require.Equal(t, 1, b.scalar(`SELECT count(*) FROM deferred_starts`), "a refused member writes nothing")
	require.Equal(t, 1, b.scalar(`SELECT size FROM deferred_groups`))
	// Another queue is another batch.
	other := b.start(startOpts{ID: "y", Batch: spec, Queue: "q2", Name: "other"})
	require.NotEqual(t, b.get("first").RunID, other.Run.RunID)
}

func TestStartRefusesBadDeferredStarts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.params(startOpts{Throttle: `{"limit": 1, "period": "1s"}`})
	fk := "mine"
	p.Req.FairnessKey = &fk
	_, err := deferred.Start(b.ctx, b.db, p)
	var ae *api.Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, "fairness_key", ae.Field)
	require.Equal(t, 400, ae.Status)

	_, err = b.try(startOpts{Batch: `{"max_size": 0, "max_wait": "1s"}`})
	require.ErrorAs(t, err, &ae)
	require.Equal(t, "batch.max_size", ae.Field)
	require.Zero(t, b.scalar(`SELECT count(*) FROM runs`))
}

func TestIdempotentOnTheStartID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	thr := `{"limit": 1, "period": "1h"}`
	b.start(startOpts{ID: "first", Throttle: thr})
	waiting := b.start(startOpts{ID: "w", Throttle: thr, Input: `{"x": 1}`})
	again := b.start(startOpts{ID: "w", Throttle: thr, Input: `{ "x" : 1 }`, At: time.Second})
	require.False(t, again.Created)
	require.True(t, waiting.Created)
	require.Equal(t, waiting.Run.FiresAt, again.Run.FiresAt)
	_, err := b.try(startOpts{ID: "w", Throttle: thr, Input: `{"x": 2}`})
	require.ErrorIs(t, err, runstore.ErrConflict)

	// An ordinary start with a waiting start's id is a conflict too, and the
	// other way round.
	_, err = runstore.Start(b.ctx, b.db, runstore.StartParams{Tenant: "acme", Req: api.StartRequest{ID: "w", Name: "wf", Queue: "q"}})
	require.ErrorIs(t, err, runstore.ErrConflict)
	_, err = runstore.Start(b.ctx, b.db, runstore.StartParams{Tenant: "acme", Req: api.StartRequest{ID: "plain", Name: "wf", Queue: "q"}})
	require.NoError(t, err)
	_, err = b.try(startOpts{ID: "plain", Throttle: thr})
	require.ErrorIs(t, err, runstore.ErrConflict)
	_, err = b.try(startOpts{ID: "plain", Batch: `{"max_size": 2, "max_wait": "1s"}`})
	require.ErrorIs(t, err, runstore.ErrConflict)

	// Replays after firing answer the run it became.
	require.Equal(t, 1, b.fire(time.Hour).Fired)
	after := b.start(startOpts{ID: "w", Throttle: thr, Input: `{"x": 1}`, At: 2 * time.Hour})
	require.False(t, after.Created)
	require.Equal(t, api.StatusQueued, after.Run.Status)
	bat := `{"max_size": 2, "max_wait": "1m"}`
	b.start(startOpts{ID: "b1", Batch: bat})
	b.start(startOpts{ID: "b2", Batch: bat})
	replay := b.start(startOpts{ID: "b1", Batch: bat})
	require.False(t, replay.Created)
	require.Equal(t, api.StatusQueued, replay.Run.Status)
	require.Equal(t, b.get("b2").RunID, replay.Run.RunID)
	_, err = b.try(startOpts{ID: "b1", Debounce: `{"period": "1s"}`})
	require.ErrorIs(t, err, runstore.ErrConflict)
}

func TestGetResolvesAStartBeforeAndAfterItFires(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := deferred.Get(b.ctx, b.db, "acme", "nothing", 0)
	require.ErrorIs(t, err, runstore.ErrNotFound)
	d := b.start(startOpts{ID: "d", Debounce: `{"period": "5s"}`})
	before := b.get("d")
	require.Equal(t, api.StatusDeferred, before.Status)
	require.True(t, before.FiresAt.Equal(at(b, 5*time.Second)))
	require.Equal(t, d.Run.RunID, before.RunID)
	// The run's own id answers too, and another tenant sees nothing.
	own := b.get(d.Run.RunID)
	require.Equal(t, api.StatusDeferred, own.Status)
	require.NotNil(t, own.FiresAt)
	_, err = deferred.Get(b.ctx, b.db, "globex", "d", 0)
	require.ErrorIs(t, err, runstore.ErrNotFound)

	b.fire(5 * time.Second)
	after := b.get("d")
	require.Equal(t, api.StatusQueued, after.Status)
	require.Nil(t, after.FiresAt)
	require.Equal(t, d.Run.RunID, after.RunID)
	plain, err := runstore.Get(b.ctx, b.db, "acme", d.Run.RunID, 0)
	require.NoError(t, err)
	require.Equal(t, api.StatusQueued, plain.Status)
}

// A waiting run is cancelled like any run: its slot is released and its
// group never fires.
func TestCancelledWhileWaiting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spec := `{"max_size": 3, "max_wait": "1m"}`
	m := b.start(startOpts{Batch: spec})
	require.Equal(t, 1, b.running())
	res, err := runstore.Cancel(b.ctx, b.db, "acme", m.Run.RunID, 0, "user")
	require.NoError(t, err)
	require.True(t, res.Cancelled)
	require.Zero(t, b.running())
	next := b.start(startOpts{Batch: spec, At: time.Second})
	require.NotEqual(t, m.Run.RunID, next.Run.RunID, "a cancelled batch takes no more members")
	rep := b.fire(2 * time.Minute)
	require.Equal(t, 1, rep.Fired)
	runs, _ := b.runs()
	require.Equal(t, 2, runs, "the cancelled run and the new batch's run")
	require.Equal(t, 1, b.scalar(`SELECT count(*) FROM tasks`))
	require.Equal(t, api.StatusCancelled, b.get(m.Run.ID).Status)

	thr := b.start(startOpts{ID: "t1", Throttle: `{"limit": 1, "period": "1h"}`})
	require.Equal(t, api.StatusQueued, thr.Run.Status)
	b.start(startOpts{ID: "t2", Throttle: `{"limit": 1, "period": "1h"}`})
	_, err = runstore.Cancel(b.ctx, b.db, "acme", "t2", 0, "user")
	require.NoError(t, err)
	rep = b.fire(2 * time.Hour)
	require.Zero(t, rep.Fired)
	require.Equal(t, 1, rep.Cancelled)
}

// limitAdmitter admits a tenant up to limit unfinished runs.
type limitAdmitter struct{ limit int }

func (l limitAdmitter) Admit(_ context.Context, a tenantcap.Admission) error {
	if a.Running > l.limit {
		e := api.NewError(api.CodeOverLimit, "over the limit of %d", l.limit)
		e.RetryAfterMS = 1000
		return e
	}
	return nil
}

// Admission is decided when a start is accepted; the slot is held while
// it waits and handed to the run when it fires.
func TestAdmissionAtAcceptance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	adm := limitAdmitter{limit: 3}
	thr := `{"limit": 1, "period": "1m"}`
	deb := `{"key": "d", "period": "10s"}`
	bat := `{"key": "b", "max_size": 10, "max_wait": "1m"}`
	b.start(startOpts{ID: "t1", Throttle: thr, Admitter: adm}) // started
	b.start(startOpts{ID: "t2", Throttle: thr, Admitter: adm}) // waits
	b.start(startOpts{ID: "d1", Debounce: deb, Admitter: adm}) // opens a window
	require.Equal(t, 3, b.running())

	for _, o := range []startOpts{
		{ID: "t3", Throttle: thr, Admitter: adm},
		{ID: "b1", Batch: bat, Admitter: adm},
		{ID: "d2", Debounce: `{"key": "other", "period": "10s"}`, Admitter: adm},
	} {
		_, err := b.try(o)
		var ae *api.Error
		require.ErrorAs(t, err, &ae, o.ID)
		require.Equal(t, 429, ae.Status)
		_, err = deferred.Get(b.ctx, b.db, "acme", o.ID, 0)
		require.ErrorIs(t, err, runstore.ErrNotFound, "a refused start leaves nothing")
	}
	require.Equal(t, 3, b.running())
	// A later start of an open window adds no run, but is asked as a start
	// would be: at the limit it is refused too.
	_, err := b.try(startOpts{ID: "d3", Debounce: deb, Admitter: adm, At: time.Second})
	var ae *api.Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, 429, ae.Status)

	// Firing asks nobody and changes no count.
	require.Equal(t, 2, b.fire(time.Minute).Fired)
	require.Equal(t, 3, b.running())
	runs, _ := b.runs()
	require.Equal(t, 3, runs)
	// The count falls when a run is final, and admits again.
	_, err = runstore.Cancel(b.ctx, b.db, "acme", "t1", 0, "user")
	require.NoError(t, err)
	require.Equal(t, 2, b.running())
	b.start(startOpts{ID: "b2", Batch: bat, Admitter: adm, At: 2 * time.Minute})
}

// Pending starts are rows: a firer that never saw them being accepted (a
// restarted process, with new connections) fires them.
func TestRestartFiresWhatAnotherProcessAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	url := testsvc.NewDBURL(t)
	old, err := pgxpool.New(b.ctx, url)
	require.NoError(t, err)
	b.start(startOpts{ID: "t0", Throttle: `{"limit": 1, "period": "1m"}`, DB: old})
	b.start(startOpts{ID: "t1", Throttle: `{"limit": 1, "period": "1m"}`, DB: old})
	b.start(startOpts{ID: "d", Debounce: `{"period": "1m"}`, DB: old})
	b.start(startOpts{ID: "b", Batch: `{"max_size": 5, "max_wait": "1m"}`, DB: old})
	old.Close()

	fresh, err := pgxpool.New(b.ctx, url)
	require.NoError(t, err)
	defer fresh.Close()
	rep, err := deferred.Fire(b.ctx, fresh, deferred.FireOptions{Now: at(b, time.Minute)})
	require.NoError(t, err)
	require.Equal(t, 3, rep.Fired)
	var runs int
	require.NoError(t, fresh.QueryRow(b.ctx, `SELECT count(*) FROM runs WHERE status = 'queued'`).Scan(&runs))
	require.Equal(t, 4, runs)
}

func TestPrune(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(startOpts{Throttle: `{"limit": 5, "period": "1m"}`})
	d := b.start(startOpts{Debounce: `{"period": "1s"}`})
	b.fire(time.Second)
	n, err := deferred.Prune(b.ctx, b.db, at(b, 30*time.Second), 0)
	require.NoError(t, err)
	require.Zero(t, n, "the throttle window still counts its run; the debounce run exists")
	n, err = deferred.Prune(b.ctx, b.db, at(b, time.Minute), 0)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = b.db.Exec(b.ctx, `DELETE FROM runs WHERE id = $1`, d.Run.RunID)
	require.NoError(t, err)
	n, err = deferred.Prune(b.ctx, b.db, at(b, time.Minute), 0)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Zero(t, b.scalar(`SELECT count(*) FROM deferred_starts`))
}

// Cancel reads what an id stands for and its run's status in one query,
// then takes the route that status calls for: each kind of id answers as
// the gateway shows it.
func TestCancelRoutesEachKindOfID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cancel := func(tenant, id string) (runstore.CancelResult, error) {
		return deferred.Cancel(b.ctx, b.db, tenant, id, 0, "user")
	}

	_, err := cancel("acme", "nobody")
	require.ErrorIs(t, err, runstore.ErrNotFound, "an id nothing was started under")

	// A throttled start waiting as deferred: cancelled, its slot given back.
	thr := `{"limit": 1, "period": "1h"}`
	b.start(startOpts{ID: "t1", Throttle: thr})
	b.start(startOpts{ID: "t2", Throttle: thr})
	require.Equal(t, 2, b.running())
	res, err := cancel("acme", "t2")
	require.NoError(t, err)
	require.True(t, res.Cancelled)
	require.Equal(t, "t2", res.Run.ID)
	require.Equal(t, api.StatusCancelled, res.Run.Status)
	require.Equal(t, 1, b.running())
	_, err = cancel("other", "t1")
	require.ErrorIs(t, err, runstore.ErrNotFound, "another tenant's id")

	// A run that started at once: the ordinary cancel.
	res, err = cancel("acme", "t1")
	require.NoError(t, err)
	require.True(t, res.Cancelled)
	require.Equal(t, "t1", res.Run.ID)
	require.Zero(t, b.running())
	res, err = cancel("acme", "t1")
	require.NoError(t, err, "cancelled again: nothing changes")
	require.False(t, res.Cancelled)
	require.Equal(t, api.StatusCancelled, res.Run.Status)

	// A member of a batch still waiting: its group's run, answered under
	// the member's id with the run's beside it.
	bat := `{"key": "bk", "max_size": 3, "max_wait": "1h"}`
	first := b.start(startOpts{ID: "b1", Batch: bat})
	b.start(startOpts{ID: "b2", Batch: bat, At: time.Second})
	_, err = cancel("other", "b2")
	require.ErrorIs(t, err, runstore.ErrNotFound, "another tenant's member start")
	res, err = cancel("acme", "b2")
	require.NoError(t, err)
	require.True(t, res.Cancelled)
	require.Equal(t, "b2", res.Run.ID)
	require.Equal(t, first.Run.RunID, res.Run.RunID)
	require.Equal(t, api.ModeBatch, res.Run.DeferMode)
	require.Equal(t, api.StatusCancelled, b.get("b1").Status)
	require.Zero(t, b.fire(2*time.Hour).Fired, "a cancelled batch never fires")
	require.Zero(t, b.running())
}
