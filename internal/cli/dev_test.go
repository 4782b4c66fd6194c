package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/natsauth"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
)

// buildHarvest compiles cmd/harvest into a temporary directory.
func buildHarvest(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "harvest")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/harvest-run/harvest/cmd/harvest")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	vars := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), "=")
		require.True(t, ok, "line %q", sc.Text())
		vars[name] = value
	}
	require.NoError(t, sc.Err())
	return vars
}

// harvest dev as a user runs it: the env file appears once the fleet takes
// starts, a start over HTTP and one over NATS (as the tenant's NATS user)
// complete, and Ctrl-C stops it with status 0, leaving no database and no
// env file behind.
func TestDevComesUpAndCleansUp(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the harvest binary")
	}
	admin := testsvc.ServerURL(t)
	bin := buildHarvest(t)
	envFile := filepath.Join(t.TempDir(), "dev.env")
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "dev", "--env-file", envFile, "--http", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "HARVEST_DATABASE_URL="+admin)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	deadline := time.Now().Add(90 * time.Second)
	for {
		if _, err := os.Stat(envFile); err == nil {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("harvest dev exited before it was ready: %v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
		case <-time.After(100 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "no env file after 90s; stderr:\n%s", &stderr)
	}
	vars := readEnvFile(t, envFile)
	want := []string{"HARVEST_GATEWAY_URL", "HARVEST_NATS_URL", "HARVEST_SHARDS", "HARVEST_MAX_RUNS", "HARVEST_ADMIN_TOKEN"}
	for _, n := range []string{"1", "2", "3"} {
		for _, f := range []string{"NAME", "TOKEN", "NATS_USER", "NATS_PASSWORD"} {
			want = append(want, "HARVEST_TENANT_"+n+"_"+f)
		}
	}
	require.Len(t, vars, len(want))
	for _, n := range want {
		require.NotEmpty(t, vars[n], n)
	}
	shards := strings.Split(vars["HARVEST_SHARDS"], ",")
	require.Len(t, shards, 2)

	// A start with plain HTTP, as curl sends it, then a wait for the end.
	ctx := context.Background()
	req, err := http.NewRequest("POST", vars["HARVEST_GATEWAY_URL"]+"/v1/runs",
		strings.NewReader(`{"name":"echo","queue":"default","input":{"hello":"world"}}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+vars["HARVEST_TENANT_1_TOKEN"])
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var run api.Run
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&run))
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	req, err = http.NewRequest("GET", vars["HARVEST_GATEWAY_URL"]+"/v1/runs/"+url.PathEscape(run.ID)+"?wait=20s", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+vars["HARVEST_TENANT_1_TOKEN"])
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&run))
	resp.Body.Close()
	require.Equal(t, api.StatusCompleted, run.Status, "run %+v", run)
	require.JSONEq(t, `{"hello":"world"}`, string(run.Output))

	// A start as a plain NATS request from tenant 2's NATS user, with its
	// inbox prefix (nats req --inbox-prefix _INBOX_<tenant> ...).
	tenant := vars["HARVEST_TENANT_2_NAME"]
	nc, err := nats.Connect(vars["HARVEST_NATS_URL"],
		nats.UserInfo(vars["HARVEST_TENANT_2_NATS_USER"], vars["HARVEST_TENANT_2_NATS_PASSWORD"]),
		nats.CustomInboxPrefix(natsauth.InboxPrefix(tenant)))
	require.NoError(t, err)
	msg, err := nc.Request("harvest.start."+tenant, []byte(`{"name":"echo","queue":"default","input":7}`), 10*time.Second)
	require.NoError(t, err)
	var natsRun api.Run
	require.NoError(t, json.Unmarshal(msg.Data, &natsRun), "%s", msg.Data)
	require.Equal(t, tenant, natsRun.Tenant)
	// Another tenant's subject is closed to this user.
	other := vars["HARVEST_TENANT_1_NAME"]
	_, err = nc.Request("harvest.start."+other, []byte(`{"name":"echo","queue":"default"}`), 2*time.Second)
	require.Error(t, err)
	nc.Close()

	// The fair claim at the fleet's defaults (one worker per shard, claiming
	// in batches of 50 into 100 task slots): weight 4 against 1 over co-due
	// runs, and a priority-10 flood before a priority-0 one, as
	// docs/fairness.md shows them.
	demo := func(args ...string) string {
		c := exec.Command(bin, append([]string{"demo"}, args...)...)
		c.Env = os.Environ()
		for k, v := range vars {
			c.Env = append(c.Env, k+"="+v)
		}
		out, err := c.CombinedOutput()
		require.NoError(t, err, "demo %v: %s", args, out)
		t.Logf("demo %v:\n%s", args, out)
		return string(out)
	}
	out := demo("share", "--runs", "400", "--lead", "2s")
	m := regexp.MustCompile(`: ([0-9.]+) claims of`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	ratio, err := strconv.ParseFloat(m[1], 64)
	require.NoError(t, err)
	require.InDelta(t, 4, ratio, 0.4, out)
	out = demo("priority", "--runs", "400", "--lead", "2s")
	m = regexp.MustCompile(`priority-10 run of \S+: (\d+) of`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	early, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	require.LessOrEqual(t, early, 3, out)

	// Ctrl-C.
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	select {
	case err := <-exited:
		require.NoError(t, err, "stderr:\n%s", &stderr)
	case <-time.After(60 * time.Second):
		t.Fatalf("harvest dev still running 60s after SIGINT; stderr:\n%s", &stderr)
	}
	require.Equal(t, 0, cmd.ProcessState.ExitCode())
	_, err = os.Stat(envFile)
	require.True(t, os.IsNotExist(err), "env file left behind")

	conn, err := pgx.Connect(ctx, admin)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for _, s := range shards {
		u, err := url.Parse(s)
		require.NoError(t, err)
		name := strings.TrimPrefix(u.Path, "/")
		require.True(t, strings.HasPrefix(name, "harvest_"), name)
		var n int
		require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n))
		require.Zero(t, n, "database %s left behind", name)
	}
}

// A --shards out of range is a usage error naming the flag, before
// anything starts.
func TestDevShardsFlagErrors(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"0", "-1", "9", "x", ""} {
		code, _, errOut := mainOut("dev", "--shards", v)
		require.Equal(t, 2, code, v)
		require.Contains(t, errOut, "-shards", v)
	}
	code, out, _ := mainOut("dev", "-h")
	require.Equal(t, 0, code)
	require.Contains(t, out, "-shards")
}
