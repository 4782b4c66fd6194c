package fuzz

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/gateway"
	"github.com/harvest-run/harvest/internal/natsauth"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/fairkeys"
	"github.com/harvest-run/harvest/pkg/weights"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

const (
	tenantSecret = "fuzz-tenant-secret"
	adminSecret  = "fuzz-admin-secret"
)

// target is an in-process gateway on a fresh shard, with a tenant token
// (acme: runs and weights) and an administrator token (everything).
type target struct {
	h  http.Handler
	nc *nats.Conn
}

func newTarget(f testing.TB, withNATS bool) *target {
	f.Helper()
	set, err := auth.ParseTokens([]byte(`[` +
		`{"name":"acme","tenant":"acme","sha256":"` + auth.HashSecret(tenantSecret) + `","privileges":["runs:start","runs:read","weights:read","weights:write"]},` +
		`{"name":"root","sha256":"` + auth.HashSecret(adminSecret) + `","privileges":["runs:read","weights:read","weights:write","config:read","config:write"]}]`))
	if err != nil {
		f.Fatal(err)
	}
	cfg := gateway.DefaultConfig([]string{testsvc.NewDBURL(f)}, "")
	cfg.MaxRuns = 1_000_000
	cfg.MaxBodyBytes = 64 << 10
	tg := &target{}
	opts := gateway.Options{Config: cfg, Tokens: auth.NewStore(set), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if withNATS {
		natsURL := testsvc.NATSURL(f)
		nc, err := nats.Connect(natsURL)
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(nc.Close)
		// acme's client, with acme's inbox: the gateway answers nowhere
		// else.
		acme, err := nats.Connect(natsURL, nats.CustomInboxPrefix(natsauth.InboxPrefix("acme")))
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(acme.Close)
		opts.NATS, tg.nc = nc, acme
	}
	g, err := gateway.New(opts)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(g.Close)
	if withNATS {
		if err := g.ServeNATS(); err != nil {
			f.Fatal(err)
		}
	}
	tg.h = g.Handler()
	return tg
}

// call sends one request to the handler and returns status and body.
func (tg *target) call(t *testing.T, method, path string, body []byte, secret string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := httptest.NewRequestWithContext(ctx, method, "http://gateway"+path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+secret)
	rec := httptest.NewRecorder()
	tg.h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.Bytes()
}

// checkAnswer requires a success, or a 4xx whose body is a JSON error with
// the same status, a code and a message.
func checkAnswer(t *testing.T, status int, body, input []byte) {
	t.Helper()
	if status >= 500 {
		t.Fatalf("status %d for input %q: %s", status, input, body)
	}
	if status < 400 {
		if !json.Valid(body) {
			t.Fatalf("status %d with a body that is not JSON for input %q: %s", status, input, body)
		}
		return
	}
	var eb api.ErrorBody
	if err := json.Unmarshal(body, &eb); err != nil || eb.Error == nil {
		t.Fatalf("status %d without an error body for input %q: %s", status, input, body)
	}
	if eb.Error.Status != status || eb.Error.Code == "" || strings.TrimSpace(eb.Error.Message) == "" {
		t.Fatalf("status %d with an unclear error for input %q: %s", status, input, body)
	}
}

var startSeeds = []string{
	`{"name":"echo","queue":"q"}`,
	`{"id":"a","name":"echo","queue":"q","input":{"x":1},"fairness_key":"k","quota_key":"k","priority":5,"delay":"1s","timeout":"2s","max_attempts":3}`,
	`{"name":"echo","queue":"q","run_at":"2030-01-01T00:00:00Z","delay":"1s"}`,
	`{"name":"echo","queue":"q","priority":1001}`,
	`{"name":"echo","queue":"q","priority":1e400}`,
	`{"name":"echo","queue":"q","input":"\u0000"}`,
	`{"name":"echo","queue":"..","fairness_key":""}`,
	`{"name":"echo","queue":"q","throttle":{"key":"k","period":"1s"}}`,
	`{"name":"echo","queue":"q","unknown":1}`,
	`{"name":"echo","queue":"q","timeout":"-1s","max_attempts":0}`,
	`{"name":"\u00ff\u0001","queue":" q "}`,
	`[]`, `null`, ``, `{`, `{"name":1}`, "\xff\xfe",
}

func FuzzHTTPStart(f *testing.F) {
	for _, s := range startSeeds {
		f.Add([]byte(s))
	}
	tg := newTarget(f, false)
	f.Fuzz(func(t *testing.T, body []byte) {
		status, out := tg.call(t, "POST", "/v1/runs", body, tenantSecret)
		checkAnswer(t, status, out, body)
	})
}

func FuzzHTTPBatch(f *testing.F) {
	for _, s := range startSeeds {
		f.Add([]byte(`{"runs":[` + s + `]}`))
	}
	f.Add([]byte(`{"runs":[]}`))
	f.Add([]byte(`{"runs":null}`))
	f.Add([]byte(`{"runs":[{"name":"echo","queue":"q"},{"name":"","queue":"q"},{"id":"x","name":"echo","queue":"q"},{"id":"x","name":"echo","queue":"r"}]}`))
	f.Add([]byte(`{"runs":{}}`))
	tg := newTarget(f, false)
	f.Fuzz(func(t *testing.T, body []byte) {
		status, out := tg.call(t, "POST", "/v1/runs/batch", body, tenantSecret)
		checkAnswer(t, status, out, body)
		if status == http.StatusOK {
			var resp api.BatchStartResponse
			if err := json.Unmarshal(out, &resp); err != nil {
				t.Fatalf("200 without results: %s", out)
			}
			for i, r := range resp.Results {
				if (r.Run == nil) == (r.Error == nil) {
					t.Fatalf("item %d has neither or both of run and error: %s", i, out)
				}
				if r.Error != nil && (r.Error.Status >= 500 || r.Error.Message == "") {
					t.Fatalf("item %d: unclear or 5xx error for input %q: %s", i, body, out)
				}
			}
		}
	})
}

func FuzzNATSStart(f *testing.F) {
	for _, s := range startSeeds {
		f.Add([]byte(s), false)
		f.Add([]byte(`{"runs":[`+s+`]}`), true)
	}
	tg := newTarget(f, true)
	f.Fuzz(func(t *testing.T, body []byte, batch bool) {
		subj := "harvest.start.acme"
		if batch {
			subj = "harvest.start_batch.acme"
		}
		msg, err := tg.nc.Request(subj, body, 30*time.Second)
		if err != nil {
			t.Fatalf("no answer to %q: %v", body, err)
		}
		status := http.StatusOK
		if s := msg.Header.Get(gateway.StatusHeader); s != "" {
			status, err = strconv.Atoi(s)
			if err != nil {
				t.Fatalf("bad status header %q", s)
			}
		}
		checkAnswer(t, status, msg.Data, body)
	})
}

func FuzzWeightBody(f *testing.F) {
	f.Add("q", "k", []byte(`{"weight":2.5}`))
	f.Add("orders.eu", "a/b", []byte(`{"weight":0.001}`))
	f.Add("q", "k", []byte(`{"weight":0}`))
	f.Add("q", "k", []byte(`{"weight":1e309}`))
	f.Add("q", "k", []byte(`{"weight":"2"}`))
	f.Add("q", "k", []byte(`{"weight":2,"x":1}`))
	f.Add("..", "", []byte(`{}`))
	f.Add(" q", "k ", []byte(``))
	f.Add("q", "\x00", []byte(`{"weight":-1}`))
	tg := newTarget(f, false)
	f.Fuzz(func(t *testing.T, queue, key string, body []byte) {
		if !routable(queue) || !routable(key) {
			return
		}
		path := "/v1/queues/" + url.PathEscape(queue) + "/weights/" + url.PathEscape(key)
		status, out := tg.call(t, "PUT", path, body, adminSecret)
		checkAnswer(t, status, out, body)
		status, out = tg.call(t, "DELETE", path, nil, adminSecret)
		checkAnswer(t, status, out, []byte(path))
		status, out = tg.call(t, "GET", "/v1/queues/"+url.PathEscape(queue)+"/weights", nil, adminSecret)
		checkAnswer(t, status, out, []byte(path))
	})
}

func FuzzQuotaBody(f *testing.F) {
	f.Add("q", "k", []byte(`{"max_concurrent":5}`))
	f.Add("q", "k", []byte(`{"max_concurrent":5,"rate":10,"burst":20}`))
	f.Add("q", "k", []byte(`{"rate":10}`))
	f.Add("q", "k", []byte(`{"max_concurrent":0,"rate":-1,"burst":0.5}`))
	f.Add("q", "k", []byte(`{}`))
	f.Add("q", "k", []byte(`{"max_concurrent":1e10}`))
	f.Add("q", "k", []byte(`{"rate":"x","burst":null}`))
	tg := newTarget(f, false)
	f.Fuzz(func(t *testing.T, queue, key string, body []byte) {
		if !routable(queue) || !routable(key) {
			return
		}
		path := "/v1/queues/" + url.PathEscape(queue) + "/quotas/" + url.PathEscape(key)
		status, out := tg.call(t, "PUT", path, body, adminSecret)
		checkAnswer(t, status, out, body)
		status, out = tg.call(t, "GET", path, nil, adminSecret)
		checkAnswer(t, status, out, []byte(path))
		status, out = tg.call(t, "DELETE", path, nil, adminSecret)
		checkAnswer(t, status, out, []byte(path))
	})
}

func FuzzAdmissionBody(f *testing.F) {
	f.Add([]byte(`{"algorithm":"static"}`))
	f.Add([]byte(`{"algorithm":"dynamic","tfm":2.5}`))
	f.Add([]byte(`{"tfm":0}`))
	f.Add([]byte(`{"tfm":-1}`))
	f.Add([]byte(`{"tfm":1e400}`))
	f.Add([]byte(`{"max_runs":10}`))
	f.Add([]byte(`{"algorithm":"fifo"}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"algorithm":null,"tfm":null}`))
	tg := newTarget(f, false)
	f.Fuzz(func(t *testing.T, body []byte) {
		status, out := tg.call(t, "PUT", "/v1/admission", body, adminSecret)
		checkAnswer(t, status, out, body)
		// A start still gets a clear answer whatever the setting became.
		start := []byte(`{"name":"echo","queue":"q"}`)
		status, out = tg.call(t, "POST", "/v1/runs", start, tenantSecret)
		checkAnswer(t, status, out, start)
	})
}

// FuzzValidators calls the validators behind the routes directly: none
// panics, every refusal says something, what the start validator accepts
// as a queue or key the dedicated validators accept too, and no run id or
// name it accepts holds a control or bidirectional-control character.
func FuzzValidators(f *testing.F) {
	f.Add("q", "k", "acme", 1.0, 0)
	f.Add("..", "", "", 0.0, 1001)
	f.Add("orders.eu", "a/b", "bad tenant", 1e-9, -1001)
	f.Add(" q", "k\x00", strings.Repeat("t", 65), math.Inf(1), 3)
	f.Add("q\u202e", "inv\u2066oice", "echo\u200f", 1.0, 0)
	f.Fuzz(func(t *testing.T, queue, key, tenant string, weight float64, priority int) {
		for _, s := range []string{queue, key, tenant} {
			named := api.StartRequest{ID: s, Name: s, Queue: "q"}
			if named.Validate() == nil && strings.ContainsFunc(s, func(r rune) bool {
				return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r)
			}) {
				t.Fatalf("run id and name %q accepted", s)
			}
		}
		for _, err := range []error{
			weights.ValidateQueue(queue), weights.ValidateOverrideKey(key), weights.ValidateQuotaKey(key),
			weights.ValidateWeight(weight), auth.ValidateTenant(tenant),
			fairkeys.ValidateQueueName(queue), fairkeys.ValidateKey(key),
		} {
			if err != nil && strings.TrimSpace(err.Error()) == "" {
				t.Fatalf("an empty refusal for %q %q %q %g", queue, key, tenant, weight)
			}
		}
		if auth.ValidateTenant(tenant) == nil && (tenant == "" || len(tenant) > auth.MaxTenantLen || strings.ContainsAny(tenant, ". *>/") || !utf8.ValidString(tenant)) {
			t.Fatalf("tenant %q accepted", tenant)
		}
		if weights.ValidateWeight(weight) == nil && !(weight >= 0.001 && weight <= 1000) {
			t.Fatalf("weight %g accepted", weight)
		}
		k := key
		req := api.StartRequest{Name: "echo", Queue: queue, FairnessKey: &k, Priority: priority}
		if e := req.Validate(); e != nil {
			if e.Status != http.StatusBadRequest || e.Message == "" || e.Field == "" {
				t.Fatalf("unclear refusal of %+v: %+v", req, e)
			}
			return
		}
		if fairkeys.ValidateQueueName(queue) != nil || fairkeys.ValidateKey(key) != nil {
			t.Fatalf("start accepted queue %q key %q that the key validators refuse", queue, key)
		}
		if priority < api.MinPriority || priority > api.MaxPriority {
			t.Fatalf("priority %d accepted", priority)
		}
	})
}

// routable reports whether a path value reaches the route at all: an empty
// segment is not this route, and "." or ".." are dot segments that the
// HTTP router cleans away (it redirects) before any handler runs; queue
// names cannot be "." or ".." for that reason.
func routable(v string) bool { return v != "" && v != "." && v != ".." }
