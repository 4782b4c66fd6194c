package runstore

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A group holding starts of a fenced tenant (one that moved away) and of
// another tenant: the fenced tenant's starts are refused as moved, with
// the new home, and nothing of them is written; the other tenant's commit.
// The fenced tenant's count carries runs still on the old home on its new
// home (tenant_away), so admission judges it with them.
func TestFencedTenantsStartsAreRefusedAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.db.Exec(b.ctx, `INSERT INTO tenant_fences (tenant, moved_to) VALUES ('gone', 2)`)
	require.NoError(t, err)
	for _, byRule := range []bool{false, true} {
		o := groupOpts{}
		if byRule {
			o.Admitter = &ruled{rule: noLimit()}
		}
		c := b.committer(t, o)
		suffix := map[bool]string{false: "-plain", true: "-ruled"}[byRule]
		out := c.StartMany(b.ctx, []StartParams{
			params(t, "gone", "g1"+suffix), params(t, "stays", "s1"+suffix), params(t, "gone", "g2"+suffix),
		})
		for _, i := range []int{0, 2} {
			m := AsMoved(out[i].Err)
			require.NotNil(t, m, "start %d: %v", i, out[i].Err)
			require.Equal(t, MovedError{Tenant: "gone", To: 2}, *m)
		}
		require.NoError(t, out[1].Err)
		require.True(t, out[1].Result.Created)
	}
	var gone, stays int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE tenant = 'gone'), count(*) FILTER (WHERE tenant = 'stays') FROM runs`).Scan(&gone, &stays))
	require.Zero(t, gone)
	require.Equal(t, 2, stays)

	_, err = b.db.Exec(b.ctx, `INSERT INTO tenant_away (tenant, runs) VALUES ('stays', 40)`)
	require.NoError(t, err)
	rec := &recorder{}
	c := b.committer(t, groupOpts{Admitter: rec})
	_, err = c.Start(b.ctx, params(t, "stays", "s3"))
	require.NoError(t, err)
	asked := rec.asked()
	require.Len(t, asked, 1)
	require.Equal(t, 43, asked[0].Running, "two runs here, this one, and forty still on the old home")
}
