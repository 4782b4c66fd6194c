package console_test

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/client"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// ceiling is the priority ceiling of tenant in force on the gateway, 0 for
// none (GET /v1/admission lists what its watcher holds).
func ceiling(t *testing.T, s *site, tenant string) int {
	t.Helper()
	for _, c := range s.admission(t).PriorityCeilings {
		if c.Tenant == tenant {
			return c.MaxPriority
		}
	}
	return 0
}

// The page lists weight overrides per queue and the latest audit rows.
func TestAdminPageShowsOverridesAndAudit(t *testing.T) {
	t.Parallel()
	b := serve(t, siteOpts{})
	c, err := client.New(client.Options{URL: b.srv.URL, Token: consoleRoot})
	require.NoError(t, err)
	_, err = c.SetWeight(b.ctx, "orders.eu", "vip", 4)
	require.NoError(t, err)
	startRun(t, b, consoleGlobex, "shared")
	startRun(t, b, consoleGlobex, "shared")
	br, _ := signIn(t, b, consoleOpsRead)
	status, page := br.get("/admin")
	require.Equal(t, 200, status)
	require.Regexp(t, `<td>orders.eu</td><td>vip</td><td class="num">4</td>`, page)
	require.Regexp(t, `<td>globex</td><td class="num">2</td>`, page)
	require.Contains(t, page, "weight.set")
	require.Contains(t, page, "<td>root</td>")
}

// The administration page sets and clears a tenant's priority ceiling and
// the scheduled share, audited as the API's changes are; a tenant's
// session and a reading operator are refused (and audited).
func TestConsolePriorityCeilingAndScheduledShare(t *testing.T) {
	t.Parallel()
	b := serve(t, siteOpts{})
	br, _ := signIn(t, b, consoleRoot)
	_, page := br.get("/admin")
	require.Contains(t, page, "Priority ceilings")
	require.Contains(t, page, `id="scheduled_share" name="scheduled_share" value="0.25"`)
	csrf := csrfOf(t, page)

	status, _, page := br.post("/admin/priority", url.Values{"tenant": {"acme"}, "max_priority": {"2000"}, "op": {"set"}, "csrf": {csrf}})
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, page, "max_priority")
	status, loc, _ := br.post("/admin/priority", url.Values{"tenant": {"acme"}, "max_priority": {"40"}, "op": {"set"}, "csrf": {csrf}})
	require.Equal(t, http.StatusSeeOther, status)
	_, page = br.get(loc)
	require.Contains(t, page, "<td>acme</td><td class=\"num\">40</td>")
	require.Equal(t, 40, ceiling(t, b, "acme"))
	status, _, _ = br.post("/admin/priority", url.Values{"tenant": {"acme"}, "op": {"clear"}, "csrf": {csrf}})
	require.Equal(t, http.StatusSeeOther, status)
	require.Equal(t, 0, ceiling(t, b, "acme"))
	require.Equal(t, 2, b.count(t, 0, `SELECT count(*) FROM audit WHERE action = $1 AND outcome = 'ok' AND actor = 'root'`, tenantcap.PriorityAction))

	status, _, _ = br.post("/admin/admission", url.Values{"algorithm": {"no_limit"}, "tfm": {"1"}, "scheduled_share": {"0.5"}, "csrf": {csrf}})
	require.Equal(t, http.StatusSeeOther, status)
	require.Equal(t, 0.5, b.admission(t).ScheduledShare)
	status, _, page = br.post("/admin/admission", url.Values{"algorithm": {"no_limit"}, "tfm": {"1"}, "scheduled_share": {"2"}, "csrf": {csrf}})
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, page, "scheduled_share")

	for _, secret := range []string{consoleOpsRead, consoleAcme} {
		br, _ := signIn(t, b, secret)
		_, page := br.get("/admin")
		if secret == consoleAcme {
			_, page = br.get("/admin/runs")
		}
		status, _, _ := br.post("/admin/priority", url.Values{"tenant": {"acme"}, "max_priority": {"1000"}, "op": {"set"}, "csrf": {csrfOf(t, page)}})
		require.Equal(t, http.StatusForbidden, status)
	}
	require.Equal(t, 0, ceiling(t, b, "acme"))
	require.Positive(t, b.count(t, 0, `SELECT count(*) FROM audit WHERE action = $1 AND outcome = 'refused' AND actor = 'ops-ro'`, tenantcap.PriorityAction))
}
