package deferred_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/pkg/api"
)

// Once a tenant is fenced off a shard (it moved away), the shard takes no
// new deferred start of it, but a window it accepted before still fires
// there, so the move can copy the fired run.
func TestFencedTenantStillFiresWhatItAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spec := `{"key": "user-1", "period": "10s"}`
	s1 := b.start(startOpts{ID: "s1", Debounce: spec})
	require.Equal(t, api.StatusDeferred, s1.Run.Status)

	_, err := b.db.Exec(b.ctx, `INSERT INTO tenant_fences (tenant, moved_to) VALUES ('acme', 1)`)
	require.NoError(t, err)
	_, err = b.try(startOpts{ID: "s2", Debounce: spec, At: time.Second})
	moved := runstore.AsMoved(err)
	require.NotNil(t, moved, "refused as moved: %v", err)
	require.Equal(t, runstore.MovedError{Tenant: "acme", To: 1}, *moved)
	_, err = b.try(startOpts{ID: "t1", Throttle: `{"key": "k", "limit": 1, "period": "1m"}`})
	require.NotNil(t, runstore.AsMoved(err), "a throttled start too: %v", err)

	require.Equal(t, 1, b.fire(10*time.Second).Fired)
	require.Equal(t, api.StatusQueued, b.get("s1").Status)
	require.Equal(t, 1, b.running())
}
