package gateway

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
)

// After a switchover a gateway's pooled connection may still reach the
// old primary, now read-only, whose writes fail with SQLSTATE 25006 (the
// fault suite's TestShardSwitchoverReadOnlyPrimary does it to real
// servers; here a trigger answers the run's insert with that code). The
// start gets 503 with Retry-After, not 500, nothing of it is written, and
// the same start sent once the shard takes writes is committed, once.
func TestStartOnAReadOnlyPrimaryIsUnavailableThenCommitted(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	status, _ := b.call(t, http.MethodPost, "/v1/runs", secretA, startBody(`"id":"warm"`))
	require.Equal(t, http.StatusCreated, status)

	_, err := b.dbs[0].Exec(ctx, `
		CREATE FUNCTION test_read_only() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN RAISE EXCEPTION 'cannot execute INSERT in a read-only transaction' USING ERRCODE = '25006'; END $$;
		CREATE TRIGGER test_read_only BEFORE INSERT ON runs FOR EACH STATEMENT EXECUTE FUNCTION test_read_only()`)
	require.NoError(t, err)
	status, retryAfter, body := failoverStart(ctx, t, b, startBody(`"id":"r1"`))
	require.Equal(t, http.StatusServiceUnavailable, status, string(body))
	require.Equal(t, api.CodeUnavailable, apiErr(t, body).Code)
	require.NotEmpty(t, retryAfter, "a 503 says when to come back")
	require.Zero(t, b.count(t, 0, `SELECT count(*) FROM runs WHERE id = 'r1'`), "nothing of the refused start is written")
	require.Equal(t, 1, b.count(t, 0, `SELECT running FROM tenant_running WHERE tenant = $1`, tenantOn[0]))

	_, err = b.dbs[0].Exec(ctx, `DROP TRIGGER test_read_only ON runs`)
	require.NoError(t, err)
	status, _, body = failoverStart(ctx, t, b, startBody(`"id":"r1"`))
	require.Equal(t, http.StatusCreated, status, string(body))
	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM runs WHERE id = 'r1'`))
	require.Equal(t, 2, b.count(t, 0, `SELECT running FROM tenant_running WHERE tenant = $1`, tenantOn[0]))
}

// failoverStart sends one start for tenant A over HTTP and returns the
// status, the Retry-After header and the body.
func failoverStart(ctx context.Context, t *testing.T, b *bundle, body string) (int, string, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.srv.URL+"/v1/runs", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+secretA)
	resp, err := b.srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header.Get("Retry-After"), out
}
