package runstore

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
)

// notifyOf reads whether the tenant's run is announced when it ends.
func (b bundle) notifyOf(t *testing.T, tenant, id string) bool {
	t.Helper()
	var on bool
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT notify FROM runs WHERE tenant = $1 AND id = $2`, tenant, id).Scan(&on))
	return on
}

// A start stores whether its run is announced, on both write paths (one
// start alone, a group of the committer); a replay that differs only in
// that is the same start and changes nothing; a long poll's request
// (Notify) turns it on for a run that is not final, once.
func TestNotifyIsStoredAndIsNotPartOfTheRequest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	on := func(r *api.StartRequest) { r.Notify = true }

	_, err := Start(b.ctx, b.db, params(t, "acme", "alone-on", on))
	require.NoError(t, err)
	_, err = Start(b.ctx, b.db, params(t, "acme", "alone-off"))
	require.NoError(t, err)
	c := b.committer(t, groupOpts{Admitter: &ruled{rule: noLimit()}})
	for _, o := range c.StartMany(b.ctx, []StartParams{params(t, "acme", "group-on", on), params(t, "acme", "group-off")}) {
		require.NoError(t, o.Err)
	}
	for id, want := range map[string]bool{"alone-on": true, "alone-off": false, "group-on": true, "group-off": false} {
		require.Equal(t, want, b.notifyOf(t, "acme", id), id)
	}

	again, err := Start(b.ctx, b.db, params(t, "acme", "alone-off", on))
	require.NoError(t, err, "a replay that asks for the announcement is no conflict")
	require.False(t, again.Created)
	require.False(t, b.notifyOf(t, "acme", "alone-off"), "a replay changes nothing")

	changed, err := Notify(b.ctx, b.db, "acme", "alone-off")
	require.NoError(t, err)
	require.True(t, changed)
	require.True(t, b.notifyOf(t, "acme", "alone-off"))
	changed, err = Notify(b.ctx, b.db, "acme", "alone-off")
	require.NoError(t, err)
	require.False(t, changed, "asked once is enough")

	_, err = Cancel(b.ctx, b.db, "acme", "group-off", 1, "stop")
	require.NoError(t, err)
	changed, err = Notify(b.ctx, b.db, "acme", "group-off")
	require.NoError(t, err)
	require.False(t, changed, "a final run is left alone")
	require.False(t, b.notifyOf(t, "acme", "group-off"))
	changed, err = Notify(b.ctx, b.db, "acme", "nobody")
	require.NoError(t, err)
	require.False(t, changed)
}
