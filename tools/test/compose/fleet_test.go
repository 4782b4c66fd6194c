package compose

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
)

// loadProject loads deploy/compose.yaml the way docker compose does from
// the deploy directory: schema validation and .env interpolation included.
func loadProject(t *testing.T) *types.Project {
	t.Helper()
	dir := repoFile(t, "deploy")
	opts, err := cli.NewProjectOptions([]string{filepath.Join(dir, "compose.yaml")},
		cli.WithWorkingDirectory(dir), cli.WithEnvFiles(), cli.WithDotEnv, cli.WithName("harvest"))
	require.NoError(t, err)
	p, err := opts.LoadProject(t.Context())
	require.NoError(t, err)
	return p
}

// TestComposeProjectLoads checks the file against the compose schema and
// the things this fleet relies on that the schema cannot say.
func TestComposeProjectLoads(t *testing.T) {
	t.Parallel()
	p := loadProject(t)
	require.Empty(t, p.Volumes["nats-data"].Name, "nats-data is gone with JetStream")
	for _, name := range []string{"gateway1", "gateway2", "worker0a", "worker0b", "worker1"} {
		s := p.Services[name]
		require.Equal(t, "unless-stopped", s.Restart, "service %s: restart", name)
	}
	require.Equal(t, "no", p.Services["migrate"].Restart)
	for _, name := range []string{"gateway1", "gateway2"} {
		require.Equal(t, "true", envValue(p.Services[name], "HARVEST_GATEWAY_KEY_BINDING"), "service %s: key binding", name)
	}
	for _, name := range []string{"worker0a", "worker0b", "worker1"} {
		require.Contains(t, strings.Join(p.Services[name].HealthCheck.Test, " "), "/readyz", "service %s: healthcheck", name)
	}
	require.Contains(t, p.Services["jaeger"].Image, "jaegertracing/jaeger:2.")
	_, old := p.Services["jaeger"].Environment["COLLECTOR_OTLP_ENABLED"]
	require.False(t, old, "jaeger v2 takes OTLP without COLLECTOR_OTLP_ENABLED")
	for _, name := range []string{"shard0", "shard1"} {
		require.Contains(t, p.Services[name].HealthCheck.Test, "127.0.0.1", "service %s: pg_isready over TCP", name)
	}
}

// envValue is the value compose gives variable k in service s.
func envValue(s types.ServiceConfig, k string) string {
	if v := s.Environment[k]; v != nil {
		return *v
	}
	return ""
}

// proc is one fleet service run as a local process.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = ln.Close() }()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

func pgIsReady(t *testing.T) string {
	if p, err := exec.LookPath("pg_isready"); err == nil {
		return p
	}
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_isready"); len(m) > 0 {
		return m[len(m)-1]
	}
	t.Skip("pg_isready not found: install the PostgreSQL client (apt-get install postgresql-client) or put it on PATH")
	return ""
}

// traceSink is the stand-in for jaeger:4318: it keeps every span that
// arrives over OTLP/HTTP with its resource's service.name.
type traceSink struct {
	mu    sync.Mutex
	spans []sinkSpan
}

type sinkSpan struct {
	service string
	span    *tracepb.Span
}

func (s *traceSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
		http.NotFound(w, r)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	for _, rs := range req.ResourceSpans {
		svc := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				svc = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				s.spans = append(s.spans, sinkSpan{service: svc, span: sp})
			}
		}
	}
	s.mu.Unlock()
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (s *traceSink) snapshot() []sinkSpan {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sinkSpan(nil), s.spans...)
}

// TestComposeFleetRuns runs the fleet deploy/compose.yaml describes as
// local processes: the binaries of the harvest:local image, the test's
// Postgres for the shards, three embedded NATS servers routed together,
// each loading the shipped nats.conf, and an OTLP receiver for Jaeger. It sets environment variables
// (nats.conf reads its passwords from them), so it does not run in
// parallel.
func TestComposeFleetRuns(t *testing.T) {
	pgReady := pgIsReady(t)
	p := loadProject(t)
	bin := buildBinaries(t)

	// Shards: one fresh database each on the test's server.
	shardURL := map[string]string{}
	for _, name := range []string{"shard0", "shard1"} {
		shardURL[name] = testsvc.NewEmptyDBURL(t)
	}

	// NATS: the three nodes, each on the shipped configuration with the
	// variables compose gives it (the same for all three: the file reads
	// the passwords and the routes from them), on local ports. The routes
	// are those compose gives, pointed at the local nodes.
	for k := range p.Services[natsNodes[0]].Environment {
		t.Setenv(k, envValue(p.Services[natsNodes[0]], k))
	}
	clusterPort := map[string]string{}
	for _, name := range natsNodes {
		clusterPort[name] = freePort(t)
	}
	natsAddr, monAddr := map[string]string{}, map[string]string{}
	var nodes []*server.Server
	for _, name := range natsNodes {
		for k := range p.Services[name].Environment {
			require.Equal(t, envValue(p.Services[natsNodes[0]], k), envValue(p.Services[name], k), "service %s: %s", name, k)
		}
		sopts, err := server.ProcessConfigFile(repoFile(t, "deploy/nats/nats.conf"))
		require.NoError(t, err)
		sopts.ServerName = name // compose's --name
		sopts.Host, sopts.Port = "127.0.0.1", server.RANDOM_PORT
		sopts.HTTPHost, sopts.HTTPPort = "127.0.0.1", server.RANDOM_PORT
		sopts.Cluster.Host = "127.0.0.1"
		sopts.Cluster.Port, err = strconv.Atoi(clusterPort[name])
		require.NoError(t, err)
		require.Len(t, sopts.Routes, len(natsNodes), "service %s: routes", name)
		for _, r := range sopts.Routes {
			local, ok := clusterPort[r.Hostname()]
			require.True(t, ok, "service %s routes to %s, no NATS node", name, r.Hostname())
			r.Host = "127.0.0.1:" + local
		}
		sopts.NoSigs, sopts.NoLog = true, true
		ns, err := server.NewServer(sopts)
		require.NoError(t, err)
		ns.Start()
		t.Cleanup(func() {
			ns.Shutdown()
			ns.WaitForShutdown()
		})
		require.True(t, ns.ReadyForConnections(10*time.Second))
		natsAddr[name], monAddr[name] = ns.Addr().String(), ns.MonitorAddr().String()
		nodes = append(nodes, ns)
	}
	require.Eventually(t, func() bool {
		for _, ns := range nodes {
			if ns.NumRemotes() != len(nodes)-1 {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "the NATS nodes did not route to one another with compose's routes")

	sink := &traceSink{}
	jaeger := httptest.NewServer(sink)
	t.Cleanup(jaeger.Close)

	// The host names and ports of the compose network, as local ones.
	hostMap := func(v string) string {
		for name, addr := range natsAddr {
			v = strings.ReplaceAll(v, "@"+name+":4222", "@"+addr)
		}
		v = strings.ReplaceAll(v, "http://jaeger:4318", jaeger.URL)
		if strings.Contains(v, "@shard") {
			parts := strings.Split(v, ",")
			for i, u := range parts {
				pu, err := url.Parse(u)
				require.NoError(t, err)
				local, ok := shardURL[pu.Hostname()]
				require.True(t, ok, "shard host %s", pu.Hostname())
				parts[i] = local
			}
			v = strings.Join(parts, ",")
		}
		return v
	}

	procs := map[string]*proc{}
	t.Cleanup(func() { stopAll(t, procs) })
	// Each service's container ports, as free local ports.
	ports := map[string]map[string]string{}
	for name := range p.Services {
		ports[name] = map[string]string{}
		for _, c := range []string{"8080", "9464"} {
			ports[name][c] = freePort(t)
		}
	}
	mapFor := func(name string, v string) string {
		v = hostMap(v)
		for c, l := range ports[name] {
			if v == ":"+c {
				v = "127.0.0.1:" + l
			}
			v = strings.ReplaceAll(v, "127.0.0.1:"+c+"/", "127.0.0.1:"+l+"/")
		}
		for _, vol := range p.Services[name].Volumes {
			if v == vol.Target {
				v = vol.Source
			}
		}
		return v
	}

	healthy := func(name string) bool {
		s := p.Services[name]
		require.NotNil(t, s.HealthCheck, "service %s: no healthcheck", name)
		test := s.HealthCheck.Test
		require.Equal(t, "CMD", test[0], "service %s", name)
		args := test[1:]
		switch args[0] {
		case "pg_isready":
			u, err := url.Parse(shardURL[name])
			require.NoError(t, err)
			local := append([]string(nil), args[1:]...)
			for i := 0; i+1 < len(local); i++ {
				switch local[i] {
				case "-h":
					local[i+1] = u.Hostname()
				case "-p":
					local[i+1] = u.Port()
				case "-d":
					local[i+1] = strings.TrimPrefix(u.Path, "/")
				case "-U":
					local[i+1] = u.User.Username()
				}
			}
			return exec.Command(pgReady, local...).Run() == nil
		case "wget":
			// The nats image's check; net/http does what wget -q -O
			// /dev/null does, so the test needs no wget.
			target := args[len(args)-1]
			if addr, ok := monAddr[name]; ok {
				target = strings.Replace(target, "127.0.0.1:8222", addr, 1)
			}
			return httpOK(target)
		case "harvest":
			local := make([]string, len(args)-1)
			for i, a := range args[1:] {
				local[i] = mapFor(name, a)
			}
			return exec.Command(filepath.Join(bin, "harvest"), local...).Run() == nil
		}
		t.Fatalf("service %s: healthcheck %v has no local stand-in", name, test)
		return false
	}

	order, err := startOrder(p)
	require.NoError(t, err)
	for _, name := range order {
		s := p.Services[name]
		for dep, d := range s.DependsOn {
			switch d.Condition {
			case types.ServiceConditionCompletedSuccessfully:
				dp := procs[dep]
				require.NotNil(t, dp, "service %s waits for %s, not run", name, dep)
				select {
				case <-dp.done:
				case <-time.After(90 * time.Second):
					t.Fatalf("service %s: %s did not finish:\n%s", name, dep, dp.out)
				}
				require.NoError(t, dp.err, "service %s: %s failed:\n%s", name, dep, dp.out)
			case types.ServiceConditionHealthy:
				require.Eventually(t, func() bool { return healthy(dep) }, 60*time.Second, 200*time.Millisecond,
					"service %s: %s not healthy", name, dep)
			case types.ServiceConditionStarted:
			default:
				t.Fatalf("service %s: depends_on %s: condition %q", name, dep, d.Condition)
			}
		}
		if s.Image != "harvest:local" {
			continue // a stand-in above plays it
		}
		procs[name] = startService(t, bin, name, s, func(v string) string { return mapFor(name, v) })
	}

	// Every long-running service becomes healthy by its own check.
	for _, name := range order {
		if procs[name] == nil || p.Services[name].Restart == "no" {
			continue
		}
		require.Eventually(t, func() bool { return healthy(name) }, 60*time.Second, 200*time.Millisecond,
			"service %s not healthy:\n%s", name, procs[name].out)
	}
	// The workers' liveness probe answers on the same listener.
	for _, name := range []string{"worker0a", "worker0b", "worker1"} {
		require.True(t, httpOK("http://127.0.0.1:"+ports[name]["9464"]+"/healthz"), name)
	}

	gw := "http://127.0.0.1:" + ports["gateway1"]["8080"]
	const token = "acme-example-secret" // deploy/README.md
	traceID := randomHex(t, 16)
	run := startRun(t, gw, token, `{"name":"echo","queue":"default","input":{"hello":"world"}}`,
		"00-"+traceID+"-"+randomHex(t, 8)+"-01")
	require.Equal(t, "acme", run.FairnessKey, "no key: the tenant's own")
	keyed := startRun(t, gw, token, `{"name":"echo","queue":"default","input":{},"fairness_key":"k"}`, "")
	require.Equal(t, "acme/k", keyed.FairnessKey, "key binding in force")

	for _, id := range []string{run.ID, keyed.ID} {
		require.Eventually(t, func() bool {
			r := getRun(t, gw, token, id)
			require.NotEqual(t, api.StatusFailed, r.Status, "run %s failed", id)
			return r.Status == api.StatusCompleted
		}, 60*time.Second, 100*time.Millisecond, "run %s did not complete", id)
	}
	require.Equal(t, "acme/k", getRun(t, gw, token, keyed.ID).FairnessKey)

	// The trace: the gateway's span and a worker's span in the trace the
	// start came with, the worker's span under a parent or linked to it.
	want, err := hex.DecodeString(traceID)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var gateway, worker bool
		for _, s := range sink.snapshot() {
			in := bytes.Equal(s.span.TraceId, want)
			switch s.service {
			case "harvest-gateway":
				gateway = gateway || in
			case "harvest-worker":
				if in && len(s.span.ParentSpanId) > 0 {
					worker = true
				}
				for _, l := range s.span.Links {
					if bytes.Equal(l.TraceId, want) {
						worker = true
					}
				}
			}
		}
		return gateway && worker
	}, 30*time.Second, 200*time.Millisecond, "connected trace %s never reached the receiver", traceID)
}

func randomHex(t *testing.T, n int) string {
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

func httpOK(u string) bool {
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func startRun(t *testing.T, gw, token, body, traceparent string) api.Run {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, gw+"/v1/runs", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	if traceparent != "" {
		req.Header.Set("traceparent", traceparent)
	}
	return doRun(t, req)
}

func getRun(t *testing.T, gw, token, id string) api.Run {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, gw+"/v1/runs/"+id+"?wait=5s", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	return doRun(t, req)
}

func doRun(t *testing.T, req *http.Request) api.Run {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Less(t, resp.StatusCode, 300, "%s %s: %s", req.Method, req.URL.Path, b)
	var r api.Run
	require.NoError(t, json.Unmarshal(b, &r), string(b))
	require.NotEmpty(t, r.ID, string(b))
	return r
}

// buildBinaries builds what the harvest:local image holds (see the
// Dockerfile): gateway, worker and harvest, named as the image names them.
func buildBinaries(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.CommandContext(t.Context(), "go", "build", "-o", dir+"/",
		"./cmd/gateway", "./cmd/worker", "./cmd/harvest")
	cmd.Dir = repoFile(t, ".")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return dir
}

// startService starts a harvest:local service: the image has no
// entrypoint, so the command's first word is the binary in
// /usr/local/bin, the rest its arguments.
func startService(t *testing.T, bin, name string, s types.ServiceConfig, mapv func(string) string) *proc {
	t.Helper()
	require.NotEmpty(t, s.Command, "service %s: no command", name)
	require.Empty(t, s.Entrypoint, "service %s: the image's entrypoint is not overridden", name)
	args := make([]string, len(s.Command)-1)
	for i, a := range s.Command[1:] {
		args[i] = mapv(a)
	}
	cmd := exec.Command(filepath.Join(bin, filepath.Base(s.Command[0])), args...)
	cmd.Env = []string{}
	for k := range s.Environment {
		cmd.Env = append(cmd.Env, k+"="+mapv(envValue(s, k)))
	}
	p := &proc{name: name, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	require.NoError(t, cmd.Start(), "service %s", name)
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p
}

func stopAll(t *testing.T, procs map[string]*proc) {
	for _, p := range procs {
		select {
		case <-p.done:
			continue
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("--- %s (%v):\n%s", p.name, p.err, p.out)
		}
	}
}

// startOrder sorts the services so that each comes after what it depends on.
func startOrder(p *types.Project) ([]string, error) {
	var order []string
	state := map[string]int{}
	var visit func(string) error
	visit = func(n string) error {
		switch state[n] {
		case 1:
			return fmt.Errorf("depends_on: cycle through %s", n)
		case 2:
			return nil
		}
		state[n] = 1
		for dep := range p.Services[n].DependsOn {
			if err := visit(dep); err != nil {
				return err
			}
		}
		state[n] = 2
		order = append(order, n)
		return nil
	}
	for _, n := range p.ServiceNames() {
		if err := visit(n); err != nil {
			return nil, err
		}
	}
	return order, nil
}
