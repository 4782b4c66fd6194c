package weights_test

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/weights"
)

func requireInvalid(t *testing.T, err error, field string) {
	t.Helper()
	var ae *api.Error
	require.True(t, errors.As(err, &ae), "want an *api.Error, got %v", err)
	require.Equal(t, 400, ae.Status)
	require.Equal(t, field, ae.Field, "message: %s", ae.Message)
}

func TestValidation(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := testsvc.NewDB(t)
	for _, tc := range []struct {
		name              string
		actor, queue, key string
		weight            float64
		field             string
	}{
		{"default key", "a", "q", "", 1, "key"},
		{"dot key", "a", "q", "..", 1, "key"},
		{"control char key", "a", "q", "a\x01", 1, "key"},
		{"long key", "a", "q", strings.Repeat("k", 257), 1, "key"},
		{"blank queue", "a", " ", "k", 1, "queue"},
		{"padded queue", "a", " q", "k", 1, "queue"},
		{"dot queue", "a", ".", "k", 1, "queue"},
		{"weight too small", "a", "q", "k", 0.0009, "weight"},
		{"weight zero", "a", "q", "k", 0, "weight"},
		{"weight too big", "a", "q", "k", 1000.5, "weight"},
		{"weight NaN", "a", "q", "k", math.NaN(), "weight"},
		{"weight inf", "a", "q", "k", math.Inf(1), "weight"},
		{"no actor", "", "q", "k", 1, "actor"},
	} {
		_, err := weights.SetOne(ctx, db, tc.actor, tc.queue, tc.key, tc.weight)
		requireInvalid(t, err, tc.field)
		_, err = weights.Set(ctx, shardsOf(db), tc.actor, tc.queue, tc.key, tc.weight)
		requireInvalid(t, err, tc.field)
	}
	// The bounds themselves are valid.
	for _, w := range []float64{0.001, 1000} {
		_, err := weights.SetOne(ctx, db, "a", "q", "k", w)
		require.NoError(t, err)
	}
	_, err := weights.ClearOne(ctx, db, "a", "q", "")
	requireInvalid(t, err, "key")

	bad := []struct {
		q     api.Quota
		field string
	}{
		{api.Quota{}, "max_concurrent"},
		{api.Quota{MaxConcurrent: ptr(0)}, "max_concurrent"},
		{api.Quota{MaxConcurrent: ptr(2_000_000)}, "max_concurrent"},
		{api.Quota{Rate: ptr(1.0)}, "burst"},
		{api.Quota{Burst: ptr(1.0)}, "rate"},
		{api.Quota{Rate: ptr(0.0), Burst: ptr(1.0)}, "rate"},
		{api.Quota{Rate: ptr(math.NaN()), Burst: ptr(1.0)}, "rate"},
		{api.Quota{Rate: ptr(1.0), Burst: ptr(0.5)}, "burst"},
		{api.Quota{Rate: ptr(1.0), Burst: ptr(math.Inf(1))}, "burst"},
	}
	for _, b := range bad {
		_, err := weights.SetQuotaOne(ctx, db, "a", "q", "qk", b.q)
		requireInvalid(t, err, b.field)
	}
	_, err = weights.SetQuotaOne(ctx, db, "a", "q", "", api.Quota{MaxConcurrent: ptr(1)})
	requireInvalid(t, err, "quota_key")

	_, err = weights.DecodeWeightBody(strings.NewReader(`{"weight":"x"}`))
	requireInvalid(t, err, "weight")
	_, err = weights.DecodeWeightBody(strings.NewReader(`{}`))
	requireInvalid(t, err, "weight")
	w, err := weights.DecodeWeightBody(strings.NewReader(`{"weight":2.5}`))
	require.NoError(t, err)
	require.Equal(t, 2.5, w)
	_, err = weights.DecodeQuotaBody(strings.NewReader(`{"rate":5}`))
	requireInvalid(t, err, "burst")
}

func TestSetClearListAudit(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := testsvc.NewDB(t)

	c, err := weights.SetOne(ctx, db, "alice", "q", "tenant-a", 3)
	require.NoError(t, err)
	require.Equal(t, weights.Change{Outcome: "ok", Overrides: 1}, c)
	c, err = weights.SetOne(ctx, db, "bob", "q", "tenant-a", 4)
	require.NoError(t, err)
	require.Equal(t, weights.Change{Outcome: "ok", Old: ptr(3.0), Overrides: 1}, c)
	// The same value again is still a success: retries converge.
	c, err = weights.SetOne(ctx, db, "bob", "q", "tenant-a", 4)
	require.NoError(t, err)
	require.Equal(t, weights.Change{Outcome: "ok", Old: ptr(4.0), Overrides: 1}, c)
	_, err = weights.SetOne(ctx, db, "bob", "q", "tenant-b", 0.5)
	require.NoError(t, err)
	_, err = weights.SetOne(ctx, db, "bob", "other", "tenant-b", 7)
	require.NoError(t, err)

	list, err := weights.List(ctx, db, "q")
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, "tenant-a", list[0].Key)
	require.Equal(t, 4.0, list[0].Weight)
	require.Equal(t, "bob", list[0].UpdatedBy)
	require.Equal(t, map[string]float64{"tenant-b": 7}, overrides(t, db, "other"))

	c, err = weights.ClearOne(ctx, db, "carol", "q", "tenant-a")
	require.NoError(t, err)
	require.Equal(t, weights.Change{Outcome: "ok", Old: ptr(4.0), Overrides: 1}, c)
	c, err = weights.ClearOne(ctx, db, "carol", "q", "tenant-a")
	require.NoError(t, err, "clearing twice is fine")
	require.Equal(t, weights.Change{Outcome: "ok", Overrides: 1}, c)
	require.Equal(t, map[string]float64{"tenant-b": 0.5}, overrides(t, db, "q"))

	rows := auditRows(t, db)
	require.Len(t, rows, 7)
	require.Equal(t, auditRow{Actor: "alice", Action: "weight.set", Queue: "q", Key: "tenant-a", Outcome: "ok",
		New: map[string]any{"weight": 3.0}}, rows[0])
	require.Equal(t, auditRow{Actor: "bob", Action: "weight.set", Queue: "q", Key: "tenant-a", Outcome: "ok",
		Old: map[string]any{"weight": 3.0}, New: map[string]any{"weight": 4.0}}, rows[1])
	require.Equal(t, "unchanged", rows[2].Message)
	require.Equal(t, auditRow{Actor: "carol", Action: "weight.clear", Queue: "q", Key: "tenant-a", Outcome: "ok",
		Old: map[string]any{"weight": 4.0}}, rows[5])
	require.Equal(t, "no override to clear", rows[6].Message)
}

func TestAuditPaging(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := testsvc.NewDB(t)
	for i := 0; i < 7; i++ {
		_, err := weights.SetOne(ctx, db, "a", "q", fmt.Sprintf("k%d", i), 2)
		require.NoError(t, err)
	}
	var keys []string
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 4)
		page, err := weights.AuditList(ctx, db, cursor, 3)
		require.NoError(t, err)
		for _, e := range page.Entries {
			keys = append(keys, *e.Key)
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	require.Equal(t, []string{"k6", "k5", "k4", "k3", "k2", "k1", "k0"}, keys, "newest first, each row once")
	_, err := weights.AuditList(ctx, db, "nonsense", 3)
	requireInvalid(t, err, "cursor")
	_, err = weights.AuditList(ctx, db, "", weights.MaxAuditLimit+1)
	requireInvalid(t, err, "limit")
}

// Fifty writers race to add new keys to a queue holding 995 overrides:
// exactly five win, the rest are refused and audited, and the queue never
// holds more than 1,000.
func TestCapRace(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := testsvc.NewDB(t)
	fill(t, db, "q", weights.MaxOverrides-5)

	const writers = 50
	var wg sync.WaitGroup
	errs := make([]error, writers)
	start := make(chan struct{})
	for i := 0; i < writers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = weights.SetOne(ctx, db, fmt.Sprintf("w%d", i), "q", fmt.Sprintf("new-%02d", i), 5)
		}()
	}
	close(start)
	wg.Wait()
	ok, refused := 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, weights.ErrCapReached):
			refused++
		default:
			t.Fatalf("unexpected error: %v", err)
		}
	}
	require.Equal(t, 5, ok)
	require.Equal(t, writers-5, refused)

	var n, counter int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM weight_overrides WHERE queue = 'q'`).Scan(&n))
	require.NoError(t, db.QueryRow(ctx, `SELECT n FROM weight_override_counts WHERE queue = 'q'`).Scan(&counter))
	require.Equal(t, weights.MaxOverrides, n)
	require.Equal(t, n, counter)

	rows := auditRows(t, db)
	var auditOK, auditRefused int
	for _, r := range rows {
		switch r.Outcome {
		case "ok":
			auditOK++
		case "refused":
			auditRefused++
			require.Nil(t, r.Old)
			require.Equal(t, map[string]any{"weight": 5.0}, r.New)
			require.Contains(t, r.Message, "cap_reached")
		}
	}
	require.Equal(t, 5, auditOK)
	require.Equal(t, writers-5, auditRefused)

	// At the cap: replacing an override is fine, a new key is not, and a
	// clear makes room for exactly one.
	c, err := weights.SetOne(ctx, db, "a", "q", "k0001", 9)
	require.NoError(t, err)
	require.Equal(t, weights.MaxOverrides, c.Overrides)
	c, err = weights.SetOne(ctx, db, "a", "q", "brand-new", 9)
	require.ErrorIs(t, err, weights.ErrCapReached)
	require.Equal(t, api.ShardOutcomeCapReached, c.Outcome)
	_, err = weights.ClearOne(ctx, db, "a", "q", "k0002")
	require.NoError(t, err)
	_, err = weights.SetOne(ctx, db, "a", "q", "brand-new", 9)
	require.NoError(t, err)
	// Another queue has its own cap.
	_, err = weights.SetOne(ctx, db, "a", "q2", "brand-new", 9)
	require.NoError(t, err)

	// Even a raw insert cannot pass the cap: the counter's check refuses
	// it, and the refusal maps to the same sentinel.
	_, err = db.Exec(ctx, `INSERT INTO weight_overrides (queue, key, weight) VALUES ('q', 'sneaky', 2)`)
	require.Error(t, err)
	require.ErrorIs(t, weights.MapError("raw insert", err), weights.ErrCapReached)
}

func TestQuotaOne(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := testsvc.NewDB(t)
	c, err := weights.SetQuotaOne(ctx, db, "a", "q", "acme", api.Quota{MaxConcurrent: ptr(3)})
	require.NoError(t, err)
	require.Nil(t, c.Old)
	c, err = weights.SetQuotaOne(ctx, db, "b", "q", "acme", api.Quota{Rate: ptr(2.5), Burst: ptr(5.0)})
	require.NoError(t, err)
	require.Equal(t, &api.Quota{MaxConcurrent: ptr(3)}, c.Old)
	list, err := weights.ListQuotas(ctx, db, "q", "")
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, api.Quota{Rate: ptr(2.5), Burst: ptr(5.0)}, list[0].Quota, "a set replaces every field")
	c, err = weights.ClearQuotaOne(ctx, db, "c", "q", "acme")
	require.NoError(t, err)
	require.Equal(t, &api.Quota{Rate: ptr(2.5), Burst: ptr(5.0)}, c.Old)
	list, err = weights.ListQuotas(ctx, db, "q", "acme")
	require.NoError(t, err)
	require.Empty(t, list)

	rows := auditRows(t, db)
	require.Len(t, rows, 3)
	require.Equal(t, auditRow{Actor: "b", Action: "quota.set", Queue: "q", Key: "acme", Outcome: "ok",
		Old: map[string]any{"max_concurrent": 3.0, "rate": nil, "burst": nil},
		New: map[string]any{"max_concurrent": nil, "rate": 2.5, "burst": 5.0}}, rows[1])
	require.Equal(t, "quota.clear", rows[2].Action)
}

func TestNotMigratedIsAnError(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	url := testsvc.NewEmptyDBURL(t)
	p := poolFor(t, url)
	_, err := weights.SetOne(ctx, p, "a", "q", "k", 2)
	require.ErrorIs(t, err, weights.ErrNotMigrated)
	res, err := weights.Set(ctx, shardsOf(p), "a", "q", "k", 2)
	require.NoError(t, err)
	require.Equal(t, []string{"error"}, outcomes(res.Shards))
	require.Equal(t, 503, res.Status())
}
