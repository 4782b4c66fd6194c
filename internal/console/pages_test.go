package console_test

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
)

// A tenant's session sees its own runs and nothing else: every console
// route naming another tenant, the operator's pages and the operator's
// actions are refused, and no answer holds the other tenant's data.
func TestConsoleTenantIsolation(t *testing.T) {
	t.Parallel()
	b := serve(t, siteOpts{})
	mine := startRun(t, b, consoleAcme, "shared")
	theirs := startRun(t, b, consoleGlobex, "shared")

	br, loc := signIn(t, b, consoleAcme)
	require.Equal(t, "/admin/runs", loc)
	status, page := br.get("/admin/runs")
	require.Equal(t, 200, status, page)
	require.Contains(t, page, `data-run="acme/`+mine.ID+`"`)
	require.Contains(t, page, `id="nav-runs"`)
	require.NotContains(t, page, `id="nav-queues"`)
	require.NotContains(t, page, `id="nav-admission"`)
	require.NotContains(t, page, `name="tenant"`, "a tenant's filter has no tenant field")
	require.Contains(t, page, `id="session-tenant">acme<`)
	require.NotContains(t, page, theirs.ID)
	require.NotContains(t, page, "globex")
	csrf := csrfOf(t, page)

	form := url.Values{"csrf": {csrf}}
	admission := url.Values{"csrf": {csrf}, "algorithm": {"static"}, "tfm": {"1"}}
	other := "/admin/runs/globex/" + url.PathEscape(theirs.ID)
	cases := []struct {
		method, path string
		form         url.Values
		status       int
		location     string
	}{
		{"GET", "/admin", nil, 303, "/admin/runs"},
		{"GET", "/admin/queues", nil, 403, ""},
		{"GET", "/admin/queues/shared", nil, 403, ""},
		{"GET", "/admin/runs?tenant=globex", nil, 403, ""},
		{"GET", other, nil, 403, ""},
		{"POST", "/admin/admission", admission, 403, ""},
		{"POST", "/admin/queues/shared/pause", form, 403, ""},
		{"POST", "/admin/queues/shared/resume", form, 403, ""},
		{"POST", other + "/cancel", form, 403, ""},
		{"POST", other + "/retry", form, 403, ""},
	}
	for _, c := range cases {
		var status int
		var loc, page string
		if c.method == "GET" {
			status, loc, page = br.getWithLocation(c.path)
		} else {
			status, loc, page = br.post(c.path, c.form)
		}
		require.Equal(t, c.status, status, "%s %s: %s", c.method, c.path, page)
		require.Equal(t, c.location, loc, "%s %s", c.method, c.path)
		require.NotContains(t, page, theirs.ID, "%s %s", c.method, c.path)
		require.NotContains(t, page, "globex", "%s %s", c.method, c.path)
		require.NotContains(t, page, "Max Workflow Runs", "%s %s", c.method, c.path)
	}
	// The refused actions changed nothing and were audited under the
	// tenant's token.
	status, out := b.call(t, "GET", "/v1/runs/"+theirs.ID, consoleGlobex, nil)
	require.Equal(t, 200, status)
	require.Equal(t, api.StatusQueued, decode[api.Run](t, out).Status)
	for _, action := range []string{"run.cancel", "run.retry", "queue.pause", "queue.resume"} {
		require.Positive(t, b.count(t, 0, `SELECT count(*) FROM audit WHERE actor = 'acme-ci' AND action = $1 AND outcome = 'refused'`, action), action)
	}

	// The tenant's own run: its page, a cancel without the CSRF field
	// (refused), with it (done), then a retry.
	own := "/admin/runs/acme/" + url.PathEscape(mine.ID)
	status, page = br.get(own)
	require.Equal(t, 200, status, page)
	require.Contains(t, page, `id="run-status"`)
	require.Contains(t, page, `data-status="queued"`)
	require.Contains(t, page, `id="cancel"`)
	require.NotContains(t, page, `id="retry"`)
	require.Contains(t, page, `id="live-region"`)
	require.Contains(t, page, `id="live" checked`)
	status, _, _ = br.post(own+"/cancel", url.Values{})
	require.Equal(t, 403, status)
	status, _, _ = br.post(own+"/cancel", url.Values{"csrf": {"forged"}})
	require.Equal(t, 403, status)
	status, out = b.call(t, "GET", "/v1/runs/"+mine.ID, consoleAcme, nil)
	require.Equal(t, 200, status)
	require.Equal(t, api.StatusQueued, decode[api.Run](t, out).Status)
	status, loc, page = br.post(own+"/cancel", form)
	require.Equal(t, 303, status, page)
	require.Equal(t, own+"?done=cancelled", loc)
	status, page = br.get(loc)
	require.Equal(t, 200, status)
	require.Contains(t, page, `id="done"`)
	require.Contains(t, page, `data-status="cancelled"`)
	require.Contains(t, page, `id="retry"`)
	require.NotContains(t, page, `id="cancel"`)
	status, loc, page = br.post(own+"/retry", form)
	require.Equal(t, 303, status, page)
	require.Equal(t, own+"?done=retried", loc)
	status, page = br.get(loc)
	require.Equal(t, 200, status)
	require.Contains(t, page, `id="done"`)

	// A tenant reader (no runs:start) sees its runs but cannot act.
	ro, loc := signIn(t, b, consoleAcmeRead)
	require.Equal(t, "/admin/runs", loc)
	status, page = ro.get(own)
	require.Equal(t, 200, status)
	status, _, page = ro.post(own+"/cancel", url.Values{"csrf": {csrfOf(t, page)}})
	require.Equal(t, 403, status)
	require.Contains(t, page, "lacks the runs:start privilege")

	// A token that is neither an operator nor a tenant's is refused at
	// sign-in.
	nb := newBrowser(t, b.srv.URL)
	_, page = nb.get("/admin")
	status, _, page = nb.post("/admin/login", url.Values{"token": {consoleNobody}, "csrf": {csrfOf(t, page)}})
	require.Equal(t, 403, status)
	require.Contains(t, page, "lacks the config:read privilege")
}

// Operators: every tenant's runs, cancel and retry with config:write only,
// the queues pages with names escaped, pause and resume with
// weights:write only.
func TestConsoleOperator(t *testing.T) {
	t.Parallel()
	b := serve(t, siteOpts{})
	const odd = `<b>x</b> / q`
	acme := startRun(t, b, consoleAcme, odd)
	globex := startRun(t, b, consoleGlobex, "shared")

	br, loc := signIn(t, b, consoleRoot)
	require.Equal(t, "/admin", loc)
	resp, err := br.hc.Get(b.srv.URL + "/admin/runs")
	require.NoError(t, err)
	resp.Body.Close()
	csp := resp.Header.Get("Content-Security-Policy")
	require.Contains(t, csp, "connect-src 'self'")
	require.Contains(t, csp, "default-src 'none'")
	require.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
	require.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"))

	status, page := br.get("/admin/runs")
	require.Equal(t, 200, status, page)
	require.Contains(t, page, `data-run="acme/`+acme.ID+`"`)
	require.Contains(t, page, `data-run="globex/`+globex.ID+`"`)
	require.Contains(t, page, `id="nav-queues"`)
	require.Contains(t, page, `id="nav-admission"`)
	require.NotContains(t, page, "<b>x</b>")
	require.Contains(t, page, "&lt;b&gt;x&lt;/b&gt;")
	status, page = br.get("/admin/runs?tenant=globex&status=queued")
	require.Equal(t, 200, status)
	require.NotContains(t, page, acme.ID)
	require.Contains(t, page, globex.ID)
	status, page = br.get("/admin/runs?status=bogus")
	require.Equal(t, 400, status)
	require.Contains(t, page, `id="error"`)

	// Queues, with the odd name escaped in the HTML and in the link.
	status, page = br.get("/admin/queues")
	require.Equal(t, 200, status, page)
	require.Contains(t, page, `id="queues"`)
	require.NotContains(t, page, "<b>x</b>")
	require.Contains(t, page, `href="/admin/queues/`+url.PathEscape(odd)+`"`)
	qpath := "/admin/queues/" + url.PathEscape(odd)
	status, page = br.get(qpath)
	require.Equal(t, 200, status, page)
	require.NotContains(t, page, "<b>x</b>")
	require.Contains(t, page, `id="depths"`)
	require.Contains(t, page, `id="share-chart"`)
	require.Contains(t, page, `id="pause"`)
	require.NotContains(t, page, `id="paused"`)
	csrf := csrfOf(t, page)

	status, _, _ = br.post(qpath+"/pause", url.Values{})
	require.Equal(t, 403, status, "no CSRF field")
	status, loc, page = br.post(qpath+"/pause", url.Values{"csrf": {csrf}})
	require.Equal(t, 303, status, page)
	require.Equal(t, qpath+"?done=paused", loc)
	status, page = br.get(loc)
	require.Equal(t, 200, status)
	require.Contains(t, page, `id="done"`)
	require.Contains(t, page, `id="paused"`)
	require.Contains(t, page, "root")
	require.Contains(t, page, `id="resume"`)
	require.NotContains(t, page, `id="pause"`)

	// A tenant nobody has heard of: 404, and the look and the actions do
	// not place it in the directory.
	status, _ = br.get("/admin/runs/nobody/x")
	require.Equal(t, 404, status)
	for _, action := range []string{"cancel", "retry"} {
		status, _, page = br.post("/admin/runs/nobody/x/"+action, url.Values{"csrf": {csrf}})
		require.Equal(t, 404, status, action)
		require.Contains(t, page, "No such run")
	}
	require.Zero(t, b.count(t, 0, `SELECT count(*) FROM tenant_homes WHERE tenant = 'nobody'`))

	// An operator without the write privileges: refused and audited.
	ro, _ := signIn(t, b, consoleOpsRead)
	status, page = ro.get(qpath)
	require.Equal(t, 200, status)
	roCSRF := csrfOf(t, page)
	status, _, page = ro.post(qpath+"/resume", url.Values{"csrf": {roCSRF}})
	require.Equal(t, 403, status)
	require.Contains(t, page, "lacks the weights:write privilege")
	run := "/admin/runs/acme/" + url.PathEscape(acme.ID)
	for _, action := range []string{"cancel", "retry"} {
		status, _, page = ro.post(run+"/"+action, url.Values{"csrf": {roCSRF}})
		require.Equal(t, 403, status)
		require.Contains(t, page, "lacks the config:write privilege")
		require.Positive(t, b.count(t, 0, `SELECT count(*) FROM audit WHERE actor = 'ops-ro' AND action = $1 AND outcome = 'refused'`, "run."+action))
	}
	require.Positive(t, b.count(t, 0, `SELECT count(*) FROM audit WHERE actor = 'ops-ro' AND action = 'queue.resume' AND outcome = 'refused'`))
	status, out := b.call(t, "GET", "/v1/runs/"+acme.ID, consoleAcme, nil)
	require.Equal(t, 200, status)
	require.Equal(t, api.StatusQueued, decode[api.Run](t, out).Status)

	status, loc, _ = br.post(qpath+"/resume", url.Values{"csrf": {csrf}})
	require.Equal(t, 303, status)
	require.Equal(t, qpath+"?done=resumed", loc)
	status, page = br.get(loc)
	require.Equal(t, 200, status)
	require.NotContains(t, page, `id="paused"`)

	// The operator cancels another tenant's run; a retry of a run that is
	// not final is refused with the page and its status.
	status, _, page = br.post(run+"/retry", url.Values{"csrf": {csrf}})
	require.Equal(t, 409, status, page)
	require.Contains(t, page, `id="error"`)
	status, loc, page = br.post(run+"/cancel", url.Values{"csrf": {csrf}})
	require.Equal(t, 303, status, page)
	require.Equal(t, run+"?done=cancelled", loc)
	status, page = br.get(loc)
	require.Equal(t, 200, status)
	require.Contains(t, page, `data-status="cancelled"`)
	require.Contains(t, page, `id="run-attempts"`)
	require.Contains(t, page, `id="tasks"`)

	// Unknown run: 404 page; a tenant nobody knows is not placed in the
	// directory by looking.
	status, _ = br.get("/admin/runs/acme/no-such-run")
	require.Equal(t, 404, status)
	status, _ = br.get("/admin/runs/initech/some-run")
	require.Equal(t, 404, status)
	require.Zero(t, b.count(t, 0, `SELECT count(*) FROM tenant_homes WHERE tenant = 'initech'`))
}

// The queue page shows the fairness modes and group weights of every
// shard and changes them; bad input names its field and changes nothing;
// a reading operator is refused and audited.
func TestConsoleFairness(t *testing.T) {
	t.Parallel()
	b := serve(t, siteOpts{})
	br, _ := signIn(t, b, consoleRoot)
	qpath := "/admin/queues/fq"
	status, page := br.get(qpath)
	require.Equal(t, 200, status, page)
	require.Contains(t, page, `id="fairness-modes"`)
	require.Contains(t, page, `data-two-level="false"`)
	require.Contains(t, page, `data-charge="claims"`)
	require.Contains(t, page, `id="fairness-form"`)
	csrf := csrfOf(t, page)

	status, _, _ = br.post(qpath+"/fairness", url.Values{"two_level": {"on"}})
	require.Equal(t, 403, status, "no CSRF field")
	status, loc, page := br.post(qpath+"/fairness", url.Values{"csrf": {csrf}, "two_level": {"on"}, "charge": {"runtime"}})
	require.Equal(t, 303, status, page)
	require.Equal(t, qpath+"?done=fairness", loc)
	status, loc, page = br.post(qpath+"/group-weights", url.Values{"csrf": {csrf}, "group": {"acme"}, "weight": {"3"}, "op": {"set"}})
	require.Equal(t, 303, status, page)
	require.Equal(t, qpath+"?done=group-weight", loc)
	status, page = br.get(loc)
	require.Equal(t, 200, status)
	require.Contains(t, page, `id="done"`)
	require.NotContains(t, page, `data-two-level="false"`)
	require.NotContains(t, page, `data-charge="claims"`)
	require.NotContains(t, page, `id="fairness-mixed"`)
	require.Contains(t, page, "acme = 3")
	require.Contains(t, page, `<option value="on" selected>`, "the form shows the modes in force")
	for _, db := range b.dbs {
		var two bool
		var charge string
		require.NoError(t, db.QueryRow(b.ctx, `SELECT two_level, charge FROM queue_fairness WHERE queue = 'fq'`).Scan(&two, &charge))
		require.True(t, two)
		require.Equal(t, "runtime", charge)
	}

	// Bad input: the page again, with the field named, nothing written.
	for field, form := range map[string]url.Values{
		"charge":    {"charge": {"seconds"}},
		"two_level": {"two_level": {"maybe"}},
	} {
		form.Set("csrf", csrf)
		status, _, page = br.post(qpath+"/fairness", form)
		require.Equal(t, 400, status, field)
		require.Contains(t, page, `id="error"`)
		require.Contains(t, page, field)
	}
	for field, form := range map[string]url.Values{
		"weight": {"group": {"acme"}, "weight": {"heavy"}, "op": {"set"}},
		"group":  {"group": {"acme/k1"}, "weight": {"2"}, "op": {"set"}},
	} {
		form.Set("csrf", csrf)
		status, _, page = br.post(qpath+"/group-weights", form)
		require.Equal(t, 400, status, field)
		require.Contains(t, page, field)
	}
	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM group_weights WHERE queue = 'fq' AND grp = 'acme' AND weight = 3`))

	status, loc, _ = br.post(qpath+"/group-weights", url.Values{"csrf": {csrf}, "group": {"acme"}, "op": {"clear"}})
	require.Equal(t, 303, status)
	require.Equal(t, qpath+"?done=group-weight-cleared", loc)
	require.Zero(t, b.count(t, 1, `SELECT count(*) FROM group_weights WHERE queue = 'fq'`))
	for _, action := range []string{"queue.fairness", "group_weight.set", "group_weight.clear"} {
		require.Equal(t, 1, b.count(t, 1, `SELECT count(*) FROM audit WHERE actor = 'root' AND action = $1 AND outcome = 'ok'`, action), action)
	}

	// A reading operator sees the modes, gets no form, and is refused.
	ro, _ := signIn(t, b, consoleOpsRead)
	status, page = ro.get(qpath)
	require.Equal(t, 200, status)
	require.Contains(t, page, `id="fairness-modes"`)
	require.NotContains(t, page, `id="fairness-form"`)
	status, _, page = ro.post(qpath+"/fairness", url.Values{"csrf": {csrfOf(t, page)}, "two_level": {"off"}})
	require.Equal(t, 403, status)
	require.Contains(t, page, "lacks the weights:write privilege")
	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM audit WHERE actor = 'ops-ro' AND action = 'queue.fairness' AND outcome = 'refused'`))

	// A tenant's session is refused the page and the actions.
	tb, _ := signIn(t, b, consoleAcme)
	_, page = tb.get("/admin/runs")
	status, _, _ = tb.post(qpath+"/group-weights", url.Values{"csrf": {csrfOf(t, page)}, "group": {"acme"}, "weight": {"9"}, "op": {"set"}})
	require.Equal(t, 403, status)
	require.Zero(t, b.count(t, 0, `SELECT count(*) FROM group_weights`))
}

// A tenant's console session names no operator: the page of its run held
// by a paused queue says the queue is paused, not by whom, and the run an
// operator cancelled in the console says so without the operator's token,
// on the page and over the API. The operator's session sees who paused.
func TestConsoleTenantSeesNoOperator(t *testing.T) {
	t.Parallel()
	b := serve(t, siteOpts{})
	status, out := b.call(t, http.MethodPost, "/v1/queues/pq/pause", consoleRoot, nil)
	require.Equal(t, http.StatusOK, status, string(out))
	status, out = b.call(t, http.MethodPost, "/v1/runs", consoleAcme, map[string]any{"id": "held", "name": "echo", "queue": "pq"})
	require.Equal(t, http.StatusCreated, status, string(out))
	page := "/admin/runs/acme/held"

	tenant, _ := signIn(t, b, consoleAcme)
	status, body := tenant.get(page)
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, `id="run-waiting"`)
	require.Contains(t, body, "the queue is paused")
	require.NotContains(t, body, "paused by")
	require.NotContains(t, body, "by root")

	op, _ := signIn(t, b, consoleRoot)
	status, body = op.get(page)
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, "paused by root")

	status, loc, body := op.post(page+"/cancel", url.Values{"csrf": {csrfOf(t, body)}})
	require.Equal(t, http.StatusSeeOther, status, body)
	require.Equal(t, page+"?done=cancelled", loc)
	status, out = b.call(t, http.MethodGet, "/v1/runs/held", consoleAcme, nil)
	require.Equal(t, http.StatusOK, status, string(out))
	run := decode[api.Run](t, out)
	require.Equal(t, api.StatusCancelled, run.Status)
	require.NotNil(t, run.Error)
	require.Contains(t, *run.Error, "an operator")
	require.NotContains(t, string(out), "root")
	status, body = tenant.get(page)
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, "cancelled by an operator")
	require.NotContains(t, body, "by root")
}
