package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/config"
	"github.com/harvest-run/harvest/internal/directory"
	"github.com/harvest-run/harvest/internal/tenantmove"
	"github.com/harvest-run/harvest/internal/testfactory"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// tenantsSetup is two migrated shards, with a pool on each for the test's
// own reads and writes, and the environment the command would read.
type tenantsSetup struct {
	cfg   tenantsEnv
	pools []*pgxpool.Pool
}

func setupTenants(t *testing.T) tenantsSetup {
	t.Helper()
	var s tenantsSetup
	for range 2 {
		u := testsvc.NewDBURL(t)
		s.cfg.Shards = append(s.cfg.Shards, u)
		p, err := pgxpool.New(context.Background(), u)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		s.pools = append(s.pools, p)
	}
	s.cfg.Settings = tenantcap.DefaultSettings()
	s.cfg.MaxRuns = 1000
	s.cfg.Prefix = "harvest"
	return s
}

// tenants runs harvest tenants args against the setup's shards, as Main
// would after reading the environment; it returns what the command wrote.
func (s tenantsSetup) tenants(ctx context.Context, stdout *bytes.Buffer, args ...string) (out, errOut string, err error) {
	if stdout == nil {
		stdout = &bytes.Buffer{}
	}
	var errb bytes.Buffer
	e := env{stdout: stdout, stderr: &errb}
	req, err := parseTenants(e, args)
	if err == nil {
		err = execTenants(ctx, e, s.cfg, req)
	}
	return stdout.String(), errb.String(), err
}

func (s tenantsSetup) list(t *testing.T) []tenantmove.Tenant {
	t.Helper()
	out, errOut, err := s.tenants(t.Context(), nil, "list", "--json")
	require.NoError(t, err, errOut)
	var got []tenantmove.Tenant
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	return got
}

func findTenant(t *testing.T, list []tenantmove.Tenant, name string) tenantmove.Tenant {
	t.Helper()
	for _, x := range list {
		if x.Tenant == name {
			return x
		}
	}
	require.Failf(t, "tenant not listed", "%s not in %+v", name, list)
	return tenantmove.Tenant{}
}

// Help goes to stdout with 0; every mistake of the command line exits 2
// naming what is wrong, before any shard is touched.
func TestTenantsUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"tenants"}, {"tenants", "-h"}, {"tenants", "--help"}, {"tenants", "help"}} {
		code, out, errOut := mainOut(args...)
		require.Equal(t, 0, code, args)
		require.Contains(t, out, "usage: harvest tenants", args)
		require.Contains(t, out, "resumes", args)
		require.Empty(t, errOut, args)
	}
	code, out, _ := mainOut("tenants", "move", "-h")
	require.Equal(t, 0, code)
	require.Contains(t, out, "-batch")

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"tenants", "frob"}, "want list, pin or move"},
		{[]string{"tenants", "list", "--bogus"}, "bogus"},
		{[]string{"tenants", "list", "extra"}, `unexpected argument "extra"`},
		{[]string{"tenants", "pin", "acme"}, "--shard is required"},
		{[]string{"tenants", "pin", "--shard", "1"}, "name the tenant"},
		{[]string{"tenants", "pin", "acme", "--shard", "-1"}, "--shard -1"},
		{[]string{"tenants", "pin", "acme", "--shard", "x"}, "-shard"},
		{[]string{"tenants", "pin", "no/slash", "--shard", "1"}, "TENANT"},
		{[]string{"tenants", "move", "acme"}, "--to is required"},
		{[]string{"tenants", "move", "--to", "1"}, "name the tenant"},
		{[]string{"tenants", "move", "acme", "--to", "-2"}, "--to -2"},
		{[]string{"tenants", "move", "acme", "--to", "1", "--batch", "0"}, "--batch 0"},
		{[]string{"tenants", "move", "acme", "--to", "1", "other"}, `unexpected argument "other"`},
	} {
		code, _, errOut := mainOut(c.args...)
		require.Equal(t, 2, code, "%v: %s", c.args, errOut)
		require.Contains(t, errOut, c.want, c.args)
	}

	// A shard beyond HARVEST_SHARDS names the flag too.
	cfg := tenantsEnv{Common: config.Common{Shards: config.Shards{deadShard, deadShard}}, Settings: tenantcap.DefaultSettings()}
	var out1, err1 bytes.Buffer
	e := env{stdout: &out1, stderr: &err1}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"move", "acme", "--to", "2"}, "--to 2: HARVEST_SHARDS has 2 shards"},
		{[]string{"pin", "acme", "--shard", "5"}, "--shard 5: HARVEST_SHARDS has 2 shards"},
	} {
		req, err := parseTenants(e, c.args)
		require.NoError(t, err, c.args)
		err = execTenants(t.Context(), e, cfg, req)
		var ue usageError
		require.ErrorAs(t, err, &ue, c.args)
		require.Contains(t, err.Error(), c.want)
	}
}

// Not parallel: the command reads HARVEST_SHARDS and HARVEST_MAX_RUNS
// through t.Setenv.
func TestTenantsReadsTheEnvironment(t *testing.T) {
	code, _, errOut := run(t, map[string]string{"HARVEST_SHARDS": ""}, "tenants", "list")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "HARVEST_SHARDS")
	a := testsvc.NewDBURL(t)
	code, _, errOut = run(t, map[string]string{"HARVEST_SHARDS": a, "HARVEST_MAX_RUNS": "0"}, "tenants", "list")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "HARVEST_MAX_RUNS")

	code, out, errOut := run(t, map[string]string{"HARVEST_SHARDS": a, "HARVEST_MAX_RUNS": "128"}, "tenants", "list")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "no tenants yet")
}

// On fresh shards the list is empty (and [] in JSON); a tenant recorded
// at its first start is listed with its home.
func TestTenantsList(t *testing.T) {
	t.Parallel()
	s := setupTenants(t)
	out, _, err := s.tenants(t.Context(), nil, "list")
	require.NoError(t, err)
	require.Contains(t, out, "no tenants yet")
	out, _, err = s.tenants(t.Context(), nil, "list", "--json")
	require.NoError(t, err)
	require.JSONEq(t, `[]`, out)

	// What a gateway does at a tenant's first start.
	_, err = directory.Place(t.Context(), s.pools[0], "acme", 1)
	require.NoError(t, err)
	acme := findTenant(t, s.list(t), "acme")
	require.Equal(t, 1, acme.Home)
	require.Equal(t, directory.PlacedByHash, acme.Entry.PlacedBy)
	require.Equal(t, directory.PhaseHome, acme.Entry.Phase)
	require.Zero(t, acme.Unfinished)

	out, _, err = s.tenants(t.Context(), nil, "list")
	require.NoError(t, err)
	require.Contains(t, out, "TENANT")
	require.Regexp(t, `(?m)^acme\s+1\s+hash\s+0\s+0\s+-$`, out)
}

// A tenant with no runs can be pinned, and is listed where it was pinned.
func TestTenantsPin(t *testing.T) {
	t.Parallel()
	s := setupTenants(t)
	out, errOut, err := s.tenants(t.Context(), nil, "pin", "newco", "--shard", "1")
	require.NoError(t, err, errOut)
	require.Contains(t, out, "newco: home shard 1 (placed by pin")

	got := findTenant(t, s.list(t), "newco")
	require.Equal(t, 1, got.Home)
	require.Equal(t, directory.PlacedByPin, got.Entry.PlacedBy)
	require.Zero(t, got.Unfinished)

	e, err := directory.Get(t.Context(), s.pools[0], "newco")
	require.NoError(t, err)
	require.Equal(t, 1, e.Shard)

	out, _, err = s.tenants(t.Context(), nil, "pin", "other", "--shard", "0", "--json")
	require.NoError(t, err)
	var entry directory.Entry
	require.NoError(t, json.Unmarshal([]byte(out), &entry), out)
	require.Equal(t, "other", entry.Tenant)
	require.Equal(t, 0, entry.Shard)
}

// makeRuns gives tenant n unfinished runs on db, each with a pending task.
func makeRuns(t *testing.T, db *pgxpool.Pool, tenant string, n int) {
	t.Helper()
	for range n {
		testfactory.Task(t.Context(), t, db, testfactory.TaskOpts{Run: testfactory.RunOpts{Tenant: tenant}})
	}
}

func countRuns(t *testing.T, db *pgxpool.Pool, tenant string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(t.Context(), `SELECT count(*) FROM runs WHERE tenant = $1`, tenant).Scan(&n))
	return n
}

// A tenant's runs move from shard 0 to shard 1 in batches, each step a
// line; the list then shows the new home and the same unfinished count,
// and moving again finds it home already.
func TestTenantsMove(t *testing.T) {
	t.Parallel()
	s := setupTenants(t)
	s.cfg.NATSURL = testsvc.NATSURL(t)
	_, err := directory.Place(t.Context(), s.pools[0], "mover", 0)
	require.NoError(t, err)
	makeRuns(t, s.pools[0], "mover", 7)

	before := findTenant(t, s.list(t), "mover")
	require.Equal(t, 0, before.Home)
	require.EqualValues(t, 7, before.Unfinished)

	out, errOut, err := s.tenants(t.Context(), nil, "move", "mover", "--to", "1", "--batch", "3")
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", out, errOut)
	require.Contains(t, out, "fence: shard 0 refuses new starts of mover")
	require.Contains(t, out, "switch: shard 1 takes mover's starts")
	require.Contains(t, out, "copy: batch 1, ")
	require.Contains(t, out, "copy: batch 3, ")
	require.Contains(t, out, "done: mover's home is shard 1")
	require.Contains(t, out, "moved mover from shard 0 to shard 1: 7 runs in ")

	after := findTenant(t, s.list(t), "mover")
	require.Equal(t, 1, after.Home)
	require.Equal(t, directory.PhaseHome, after.Entry.Phase)
	require.EqualValues(t, 7, after.Unfinished)
	require.Equal(t, 7, countRuns(t, s.pools[1], "mover"))
	require.Zero(t, countRuns(t, s.pools[0], "mover"))

	out, _, err = s.tenants(t.Context(), nil, "move", "mover", "--to", "1")
	require.NoError(t, err)
	require.Contains(t, out, "its home is shard 1 already")
}

// cancelOn is the command's stdout; it cancels the command's context once
// a line containing at has been written, as Ctrl-C would there.
type cancelOn struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	at     string
	cancel context.CancelFunc
}

func (c *cancelOn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.buf.Write(p)
	if strings.Contains(c.buf.String(), c.at) {
		c.cancel()
	}
	return n, err
}

// Ctrl-C in the middle of the copy stops the move with a message saying
// to run the same command again, and running it again finishes the move
// with every run moved once.
func TestTenantsMoveInterruptedResumes(t *testing.T) {
	t.Parallel()
	s := setupTenants(t)
	_, err := directory.Place(t.Context(), s.pools[0], "halfway", 0)
	require.NoError(t, err)
	makeRuns(t, s.pools[0], "halfway", 5)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := &cancelOn{at: "copy: batch 1,", cancel: cancel}
	var errb bytes.Buffer
	e := env{stdout: w, stderr: &errb}
	req, err := parseTenants(e, []string{"move", "halfway", "--to", "1", "--batch", "2"})
	require.NoError(t, err)
	err = execTenants(ctx, e, s.cfg, req)
	require.Error(t, err, "stdout:\n%s", w.buf.String())
	require.Contains(t, err.Error(), "interrupted")
	require.Contains(t, err.Error(), "run harvest tenants move halfway --to 1 to resume")

	out, errOut, err := s.tenants(t.Context(), nil, "move", "halfway", "--to", "1", "--batch", "2")
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", out, errOut)
	require.Contains(t, out, "resuming the move of halfway from shard 0 to shard 1")
	require.Contains(t, out, "done: halfway's home is shard 1")

	got := findTenant(t, s.list(t), "halfway")
	require.Equal(t, 1, got.Home)
	require.EqualValues(t, 5, got.Unfinished)
	require.Equal(t, 5, countRuns(t, s.pools[1], "halfway"))
	require.Zero(t, countRuns(t, s.pools[0], "halfway"))
}

func TestThousands(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1200: "1,200", 1234567: "1,234,567", -4500: "-4,500"} {
		require.Equal(t, want, thousands(n), n)
	}
}

// The table and the progress lines, whatever the move engine does.
func TestTenantsOutput(t *testing.T) {
	t.Parallel()
	one, two := 1, 2
	var b bytes.Buffer
	printTenants(&b, []tenantmove.Tenant{
		{Tenant: "acme", Home: 0, Entry: directory.Entry{Tenant: "acme", Phase: directory.PhaseHome, PlacedBy: directory.PlacedByHash}, Unfinished: 1200, Keys: 3},
		{Tenant: "globex", Home: 1, Entry: directory.Entry{Tenant: "globex", Shard: 1, Phase: directory.PhaseFencing, MoveTo: &two, PlacedBy: directory.PlacedByPin}},
		{Tenant: "initech", Home: 2, Entry: directory.Entry{Tenant: "initech", Shard: 2, Phase: directory.PhaseCopying, MovingFrom: &one, PlacedBy: directory.PlacedByMove}, Unfinished: 7},
		{Tenant: "old", Home: -1, Unfinished: 4},
	})
	out := b.String()
	require.Regexp(t, `(?m)^TENANT\s+HOME\s+PLACED\s+UNFINISHED\s+KEYS\s+MOVE$`, out)
	require.Regexp(t, `(?m)^acme\s+0\s+hash\s+1,200\s+3\s+-$`, out)
	require.Regexp(t, `(?m)^globex\s+1\s+pin\s+0\s+0\s+fencing \(to shard 2\)$`, out)
	require.Regexp(t, `(?m)^initech\s+2\s+move\s+7\s+0\s+copying \(from shard 1\)$`, out)
	require.Regexp(t, `(?m)^old\s+-\s+\(no entry\)\s+4\s+0\s+-$`, out)

	require.Equal(t, "fence: shard 0 refuses new starts of acme (the gateways send them to shard 1)",
		stepLine(tenantmove.Step{Name: "fence"}, "acme", "shard 0", 1))
	require.Equal(t, "copy: batch 3, 500 runs written on shard 1",
		stepLine(tenantmove.Step{Name: "copy", Batch: 3, Runs: 500}, "acme", "shard 0", 1))
	require.Equal(t, "drop: batch 3, 500 runs removed from shard 0 (1,200 left)",
		stepLine(tenantmove.Step{Name: "drop", Batch: 3, Runs: 500, Waiting: 1200}, "acme", "shard 0", 1))
	require.Equal(t, "done: acme's home is shard 1", stepLine(tenantmove.Step{Name: "done"}, "acme", "shard 0", 1))
}
