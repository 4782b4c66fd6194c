package runstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// recorder is a tenantcap.Hook that notes every Admission it is asked about and
// refuses a tenant's start once the tenant would hold more than limit runs
// (no limit when zero).
type recorder struct {
	limit int
	// refuse names runs refused whatever the counts.
	refuse map[string]bool

	mu   sync.Mutex
	seen []tenantcap.Admission
}

func (r *recorder) Admit(_ context.Context, a tenantcap.Admission) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, a)
	if (r.limit > 0 && a.Running > r.limit) || r.refuse[a.Req.ID] {
		return &api.Error{Status: 429, Code: api.CodeOverLimit, Message: "over the limit", RetryAfterMS: 100}
	}
	return nil
}

func (r *recorder) asked() []tenantcap.Admission {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]tenantcap.Admission(nil), r.seen...)
}

// ruled is a Ruler: the group's statement applies its rule, so nothing
// should be asked of it in Go; it notes the decisions reported.
type ruled struct {
	recorder
	rule tenantcap.Rule

	admitted int
	refused  []tenantcap.Decision
}

// noLimit admits every start.
func noLimit() tenantcap.Rule {
	return tenantcap.Rule{Config: tenantcap.DefaultConfig(), MaxRuns: 1 << 30, RetryAfter: time.Second}
}

// staticLimit lets each tenant hold limit runs (Static) in a system that
// is never full.
func staticLimit(limit int) tenantcap.Rule {
	return tenantcap.Rule{Config: tenantcap.Config{Algorithm: api.AlgorithmStatic, TFM: 1}, MaxRuns: 1000 * limit,
		Tenants: 1000, RetryAfter: time.Second}
}

func (r *ruled) Rule(int) (tenantcap.Rule, error)                    { return r.rule, nil }
func (r *ruled) Acquire(context.Context, int, int, int) (int, error) { return 0, nil }

func (r *ruled) Decided(admitted int, refused []tenantcap.Decision) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.admitted += admitted
	r.refused = append(r.refused, refused...)
}

// groupOpts shapes a committer whose groups are predictable: one flusher
// that waits long enough for every start of one StartMany call.
type groupOpts struct {
	Admitter tenantcap.Hook
}

func (b bundle) committer(t *testing.T, o groupOpts) *Committer {
	t.Helper()
	c := NewCommitter(b.db, 1, CommitterOptions{Flushers: 1, Linger: 200 * time.Millisecond, Admitter: o.Admitter})
	t.Cleanup(c.Close)
	return c
}

// params builds a validated start; queue "shared" unless given.
func params(t *testing.T, tenant, id string, mods ...func(*api.StartRequest)) StartParams {
	t.Helper()
	req := api.StartRequest{ID: id, Name: "echo", Queue: "shared", Input: json.RawMessage(`{"id":"` + id + `"}`)}
	for _, m := range mods {
		m(&req)
	}
	require.Nil(t, req.Validate())
	return StartParams{Tenant: tenant, Shard: 1, Req: req}
}

// The counts each new run of a group is judged by are those it would have
// had with the starts written one by one, in the group's order, and
// without the starts refused before it.
func TestGroupAdmissionSeesSequentialCounts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		refuse map[string]bool
		want   map[string][2]int
	}{
		// Written in (queue, key, tenant, id) order: acme a1 a2 a3, globex
		// g1 g2; acme held 5 runs and globex 2.
		{"all admitted", nil, map[string][2]int{
			"a1": {6, 8}, "a2": {7, 9}, "a3": {8, 10}, "g1": {3, 11}, "g2": {4, 12}}},
		{"a2 refused", map[string]bool{"a2": true}, map[string][2]int{
			"a1": {6, 8}, "a2": {7, 9}, "a3": {7, 9}, "g1": {3, 10}, "g2": {4, 11}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			_, err := b.db.Exec(b.ctx, `INSERT INTO tenant_running (tenant, running) VALUES ('acme', 5), ('globex', 2)`)
			require.NoError(t, err)
			rec := &recorder{refuse: tc.refuse}
			c := b.committer(t, groupOpts{Admitter: rec})
			ps := []StartParams{
				params(t, "acme", "a1"), params(t, "globex", "g1"), params(t, "acme", "a2"),
				params(t, "acme", "a3"), params(t, "globex", "g2"),
			}
			out := c.StartMany(b.ctx, ps)
			for i, o := range out {
				if tc.refuse[ps[i].Req.ID] {
					require.Error(t, o.Err)
					continue
				}
				require.NoError(t, o.Err)
			}
			// The first time each run was asked about: the decisions made
			// on the group as first written.
			got := map[string][2]int{}
			for _, a := range rec.asked() {
				if _, seen := got[a.Req.ID]; !seen {
					got[a.Req.ID] = [2]int{a.Running, a.ShardRunning}
				}
			}
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.want["a3"][0], b.running(t, "acme"))
			require.Equal(t, 4, b.running(t, "globex"))
		})
	}
}

// A start refused in the middle of a group leaves nothing behind, and the
// starts after it are judged as if it had never been written: by a Go
// hook (asked after the group is written), and by the rule the group's
// statement applies.
func TestGroupRefusalLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	for _, byRule := range []bool{false, true} {
		t.Run(fmt.Sprintf("rule=%v", byRule), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			rec := &recorder{limit: 2}
			var adm tenantcap.Hook = rec
			r := &ruled{rule: staticLimit(2)}
			if byRule {
				adm = r
			}
			c := b.committer(t, groupOpts{Admitter: adm})
			out := c.StartMany(b.ctx, []StartParams{
				params(t, "acme", "r1"), params(t, "acme", "r2"), params(t, "acme", "r3"),
				params(t, "globex", "g1"), params(t, "acme", "r4"),
			})
			for i, want := range []bool{true, true, false, true, false} {
				if want {
					require.NoError(t, out[i].Err, "start %d", i)
					continue
				}
				var ae *api.Error
				require.ErrorAs(t, out[i].Err, &ae, "start %d", i)
				require.Equal(t, api.CodeOverLimit, ae.Code)
			}
			require.Equal(t, 2, b.running(t, "acme"))
			require.Equal(t, 1, b.running(t, "globex"))
			require.Equal(t, 3, b.count(t, `SELECT count(*) FROM runs`))
			require.Equal(t, 3, b.count(t, `SELECT count(*) FROM tasks`))
			require.Equal(t, 3, b.count(t, `SELECT count(*) FROM tasks WHERE queue = 'shared' AND state = 'pending'`))
			require.Zero(t, b.count(t, `SELECT count(*) FROM runs WHERE id IN ('r3', 'r4')`))
			if byRule {
				require.Empty(t, r.asked(), "the statement decided, nobody was asked")
				require.Equal(t, 3, r.admitted)
				require.Len(t, r.refused, 2)
				for _, d := range r.refused {
					require.Equal(t, tenantcap.ReasonTenant, d.Reason)
					require.Equal(t, 2, d.Own)
				}
			}
		})
	}
}

// A group under a rule commits in the round trip that writes it: nobody is
// asked, and the result is the stored run.
func TestRuledGroupCommitsWithoutAsking(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := &ruled{rule: noLimit()}
	c := b.committer(t, groupOpts{Admitter: r})
	ps := []StartParams{params(t, "acme", "r1"), params(t, "acme", "r2"), params(t, "globex", "g1")}
	out := c.StartMany(b.ctx, ps)
	for i, o := range out {
		require.NoError(t, o.Err)
		require.True(t, o.Result.Created)
		stored, err := Get(b.ctx, b.db, ps[i].Tenant, ps[i].Req.ID, 1)
		require.NoError(t, err)
		require.Equal(t, stored, o.Result.Run, "the answer is the stored run")
		require.NotZero(t, o.Result.TaskID)
	}
	require.Empty(t, r.asked())
	require.Equal(t, 3, r.admitted)
	require.Equal(t, 2, b.running(t, "acme"))
}

// A start the database refuses fails alone; the others of its group
// commit.
func TestGroupStatementErrorFailsOneStart(t *testing.T) {
	t.Parallel()
	for _, byRule := range []bool{false, true} {
		t.Run(fmt.Sprintf("rule=%v", byRule), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var adm tenantcap.Hook = &recorder{}
			if byRule {
				adm = &ruled{rule: noLimit()}
			}
			c := b.committer(t, groupOpts{Admitter: adm})
			bad := params(t, "acme", "bad")
			bad.Req.Priority = 5000 // past the column's check; Validate would have refused it
			out := c.StartMany(b.ctx, []StartParams{params(t, "acme", "r1"), bad, params(t, "acme", "r2")})
			require.NoError(t, out[0].Err)
			require.Error(t, out[1].Err)
			require.NoError(t, out[2].Err)
			require.Equal(t, 2, b.count(t, `SELECT count(*) FROM runs`))
			require.Equal(t, 2, b.count(t, `SELECT count(*) FROM tasks`))
			require.Equal(t, 2, b.running(t, "acme"))
		})
	}
}

// Within one group a second start of an id is a replay of the first (or a
// conflict when it differs), and an id that already exists is answered
// with the stored run.
func TestGroupReplaysAndConflicts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.committer(t, groupOpts{Admitter: &ruled{rule: noLimit()}})
	_, err := c.Start(b.ctx, params(t, "acme", "old"))
	require.NoError(t, err)
	other := params(t, "acme", "dup", func(r *api.StartRequest) { r.Input = json.RawMessage(`{"other":true}`) })
	out := c.StartMany(b.ctx, []StartParams{
		params(t, "acme", "dup"), params(t, "acme", "dup"), other, params(t, "acme", "old"), params(t, "globex", "dup"),
	})
	require.NoError(t, out[0].Err)
	require.NoError(t, out[1].Err)
	require.ErrorIs(t, out[2].Err, ErrConflict)
	require.NoError(t, out[3].Err)
	require.NoError(t, out[4].Err)
	require.NotEqual(t, out[0].Result.Created, out[1].Result.Created, "one of the two made the run")
	require.False(t, out[3].Result.Created)
	require.True(t, out[4].Result.Created, "ids are per tenant")
	require.Equal(t, out[0].Result.Run.CreatedAt, out[1].Result.Run.CreatedAt)
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM runs`))
	require.Equal(t, 2, b.running(t, "acme"))
}

// A start whose queue had no pending task is told so (it is worth a
// dispatch); the next start of the same group in that queue is not.
func TestGroupQueueBusy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.committer(t, groupOpts{})
	later := params(t, "acme", "later", func(r *api.StartRequest) { d := api.Duration(time.Hour); r.Delay = &d })
	out := c.StartMany(b.ctx, []StartParams{
		params(t, "acme", "a1", func(r *api.StartRequest) { r.Queue = "alpha" }),
		params(t, "acme", "a2", func(r *api.StartRequest) { r.Queue = "alpha" }),
		later,
		params(t, "acme", "b1", func(r *api.StartRequest) { r.Queue = "beta" }),
	})
	busy := map[string]bool{}
	for _, o := range out {
		require.NoError(t, o.Err)
		busy[o.Result.Run.ID] = o.Result.QueueBusy
	}
	require.Equal(t, map[string]bool{"a1": false, "a2": true, "later": false, "b1": false}, busy)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tasks WHERE state = 'scheduled'`))
}

// Many callers of several tenants through several flushers: each tenant's
// limit holds exactly, every admitted start has its run, task and count,
// and the flushers end with Close. Not parallel, so the goroutine check
// sees only this test's.
func TestCommitterConcurrentTenantsKeepLimits(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	b := setup(t)
	const tenants, perTenant, limit = 5, 30, 24
	c := NewCommitter(b.db, 1, CommitterOptions{Flushers: 3, MaxBatch: 8, Admitter: &recorder{limit: limit}})
	var admitted, refused sync.Map
	var callers sync.WaitGroup
	for caller := range 10 {
		callers.Go(func() {
			tenant := fmt.Sprint("tenant", caller%tenants)
			for i := range perTenant / 2 {
				id := fmt.Sprintf("c%d-%d", caller, i)
				_, err := c.Start(b.ctx, params(t, tenant, id))
				var ae *api.Error
				switch {
				case err == nil:
					admitted.Store(tenant+"/"+id, true)
				case errors.As(err, &ae) && ae.Code == api.CodeOverLimit:
					refused.Store(tenant+"/"+id, true)
				default:
					t.Errorf("start %s/%s: %v", tenant, id, err)
				}
			}
		})
	}
	callers.Wait()
	c.Close()
	for i := range tenants {
		tenant := fmt.Sprint("tenant", i)
		require.Equal(t, limit, b.count(t, `SELECT count(*) FROM runs WHERE tenant = $1`, tenant))
		require.Equal(t, limit, b.running(t, tenant))
	}
	n := 0
	admitted.Range(func(any, any) bool { n++; return true })
	require.Equal(t, tenants*limit, n)
	require.Equal(t, tenants*limit, b.count(t, `SELECT count(*) FROM tasks`))
	require.Equal(t, tenants*limit, b.count(t, `SELECT count(*) FROM tasks WHERE queue = 'shared' AND state = 'pending'`))
	_, err := c.Start(b.ctx, params(t, "tenant0", "after-close"))
	require.ErrorIs(t, err, ErrClosed)
}

// A group holds the shard's admission lock and its tenants' count rows for
// its statement, not while it waits for its commit to reach the disk:
// while one group waits for its flush (held there by a test hook), the
// admission lock and its tenant's row are free, and another group, of the
// same tenant even, commits and is answered.
func TestGroupsOverlapTheirFlushes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := NewCommitter(b.db, 1, CommitterOptions{Flushers: 2, MaxBatch: 4, Admitter: &ruled{rule: noLimit()}})
	t.Cleanup(c.Close)
	waiting, release := make(chan struct{}), make(chan struct{})
	var (
		first    atomic.Bool
		released sync.Once
	)
	// Runs before c.Close: a failing check must not leave the hook waiting.
	t.Cleanup(func() { released.Do(func() { close(release) }) })
	c.committed = func() {
		if first.CompareAndSwap(false, true) {
			close(waiting)
			<-release
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Start(b.ctx, params(t, "acme", "a1"))
		done <- err
	}()
	select {
	case <-waiting:
	case err := <-done:
		t.Fatalf("the first group was answered (%v) without its commit", err)
	}

	var held int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND classid = 1213346391 AND objid = 0 AND objsubid = 2
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&held))
	require.Zero(t, held, "the shard's admission lock is free while the group waits for its flush")
	tx, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `SELECT 1 FROM tenant_running WHERE tenant = 'acme' FOR NO KEY UPDATE NOWAIT`)
	require.NoError(t, err, "a completion of the tenant could take its count row meanwhile")
	require.NoError(t, tx.Rollback(b.ctx))

	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	res, err := c.Start(ctx, params(t, "acme", "a2"))
	require.NoError(t, err, "a second group commits while the first waits for its flush")
	require.True(t, res.Created)
	select {
	case err := <-done:
		t.Fatalf("the first group was answered (%v) before its flush", err)
	default:
	}
	released.Do(func() { close(release) })
	require.NoError(t, <-done)
}
