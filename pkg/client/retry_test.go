package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
)

// fakeGateway stands in for the gateway: it answers each request with the
// next of answers (the last one repeats) and records what it received.
type fakeGateway struct {
	mu      sync.Mutex
	answers []fakeAnswer
	got     []*http.Request
	bodies  [][]byte
}

// fakeAnswer is one answer of a fakeGateway; a zero status answers 201
// with a run whose id is the start's.
type fakeAnswer struct {
	status     int
	code       api.Code
	retryAfter string
}

func newFake(t *testing.T, answers ...fakeAnswer) (*fakeGateway, *httptest.Server) {
	t.Helper()
	f := &fakeGateway{answers: answers}
	srv := httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(srv.Close)
	return f, srv
}

func (f *fakeGateway) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	n := len(f.got)
	f.got = append(f.got, r)
	f.bodies = append(f.bodies, body)
	a := fakeAnswer{}
	if len(f.answers) > 0 {
		a = f.answers[min(n, len(f.answers)-1)]
	}
	f.mu.Unlock()
	if a.retryAfter != "" {
		w.Header().Set("Retry-After", a.retryAfter)
	}
	w.Header().Set("Content-Type", "application/json")
	if a.status == 0 {
		var req api.StartRequest
		_ = json.Unmarshal(body, &req)
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(api.Run{ID: req.ID, Name: req.Name, Queue: req.Queue, Status: api.StatusQueued})
		return
	}
	w.WriteHeader(a.status)
	if a.code != "" {
		_ = json.NewEncoder(w).Encode(api.ErrorBody{Error: &api.Error{Status: a.status, Code: a.code, Message: "refused"}})
	}
}

func (f *fakeGateway) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.got)
}

// ids returns the run id of every start the fake received.
func (f *fakeGateway) ids(t *testing.T) []string {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for _, b := range f.bodies {
		var req api.StartRequest
		require.NoError(t, json.Unmarshal(b, &req))
		ids = append(ids, req.ID)
	}
	return ids
}

func newClient(t *testing.T, url string, retry *client.RetryPolicy) *client.Client {
	t.Helper()
	c, err := client.New(client.Options{URL: url, Token: "secret", Retry: retry})
	require.NoError(t, err)
	return c
}

// A start without an id leaves the client with a UUIDv7, and the retry
// after a 503 carries that same id, so the gateway can replay rather than
// start a second run.
func TestStartIDIsSetOnceAndKeptAcrossRetries(t *testing.T) {
	t.Parallel()
	f, srv := newFake(t, fakeAnswer{status: http.StatusServiceUnavailable, code: api.CodeUnavailable, retryAfter: "1"}, fakeAnswer{})
	c := newClient(t, srv.URL, &client.RetryPolicy{MaxAttempts: 3, MaxDelay: 2 * time.Second})
	began := time.Now()
	st, err := c.Start(context.Background(), "resize", "images", map[string]string{"src": "a.png"}, client.StartOptions{})
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(began), time.Second, "Retry-After: 1 was honoured")
	ids := f.ids(t)
	require.Len(t, ids, 2)
	require.NotEmpty(t, ids[0])
	require.Equal(t, ids[0], ids[1], "the retry carries the first attempt's id")
	u, err := uuid.Parse(ids[0])
	require.NoError(t, err)
	require.Equal(t, uuid.Version(7), u.Version())
	require.Equal(t, ids[0], st.Run.ID)
	require.True(t, st.Created)
}

// A gateway shedding load answers 503 with Retry-After: 1 a few times; the
// client waits at least that long before each new attempt, keeps the
// start's id, and gets the run once the gateway takes it.
func TestRetryBacksOffOnRetryAfter(t *testing.T) {
	t.Parallel()
	shed := fakeAnswer{status: http.StatusServiceUnavailable, code: api.CodeUnavailable, retryAfter: "1"}
	f, srv := newFake(t, shed, shed, fakeAnswer{})
	var at []time.Time
	var mu sync.Mutex
	wrapped := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		at = append(at, time.Now())
		mu.Unlock()
		f.serve(w, r)
	}))
	t.Cleanup(wrapped.Close)
	_ = srv
	c := newClient(t, wrapped.URL, &client.RetryPolicy{MaxAttempts: 5, MaxDelay: 2 * time.Second})
	st, err := c.Start(context.Background(), "n", "q", nil, client.StartOptions{})
	require.NoError(t, err)
	require.True(t, st.Created)
	ids := f.ids(t)
	require.Len(t, ids, 3)
	require.Equal(t, ids[0], ids[2])
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(at); i++ {
		require.GreaterOrEqual(t, at[i].Sub(at[i-1]), time.Second, "attempt %d came before the Retry-After", i+1)
	}
}

// An id the caller chose is sent as it is.
func TestStartKeepsCallersID(t *testing.T) {
	t.Parallel()
	f, srv := newFake(t)
	c := newClient(t, srv.URL, nil)
	_, err := c.Start(context.Background(), "resize", "images", nil, client.StartOptions{ID: "mine"})
	require.NoError(t, err)
	require.Equal(t, []string{"mine"}, f.ids(t))
}

// StartBatch fills the missing ids without touching the caller's slice.
func TestStartBatchFillsIDs(t *testing.T) {
	t.Parallel()
	var got api.BatchStartRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.NoError(t, json.NewDecoder(r.Body).Decode(&got))
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(api.BatchStartResponse{})
	}))
	t.Cleanup(srv.Close)
	c := newClient(t, srv.URL, nil)
	reqs := []api.StartRequest{{Name: "a", Queue: "q"}, {ID: "kept", Name: "b", Queue: "q"}}
	_, err := c.StartBatch(context.Background(), reqs)
	require.NoError(t, err)
	require.Empty(t, reqs[0].ID, "the caller's request is not changed")
	require.Len(t, got.Runs, 2)
	require.NotEmpty(t, got.Runs[0].ID)
	require.Equal(t, "kept", got.Runs[1].ID)
}

// Without a policy a 503 is answered at once.
func TestNoRetryWithoutPolicy(t *testing.T) {
	t.Parallel()
	f, srv := newFake(t, fakeAnswer{status: http.StatusServiceUnavailable, code: api.CodeUnavailable, retryAfter: "0"})
	c := newClient(t, srv.URL, nil)
	_, err := c.Start(context.Background(), "resize", "images", nil, client.StartOptions{})
	require.ErrorIs(t, err, client.ErrUnavailable)
	require.Equal(t, 1, f.count())
}

// The policy's MaxAttempts counts every attempt; the last answer's error
// is returned.
func TestRetryStopsAtMaxAttempts(t *testing.T) {
	t.Parallel()
	f, srv := newFake(t, fakeAnswer{status: http.StatusTooManyRequests, code: api.CodeOverLimit})
	c := newClient(t, srv.URL, &client.RetryPolicy{MaxAttempts: 3, MaxDelay: 5 * time.Millisecond})
	_, err := c.Get(context.Background(), "r1")
	require.ErrorIs(t, err, client.ErrOverLimit)
	require.Equal(t, 3, f.count())
}

// A 503 after a few tries is followed by the answer that succeeds.
func TestRetryRecovers(t *testing.T) {
	t.Parallel()
	f, srv := newFake(t,
		fakeAnswer{status: http.StatusServiceUnavailable},
		fakeAnswer{status: http.StatusTooManyRequests, code: api.CodeOverLimit, retryAfter: "0"},
		fakeAnswer{})
	c := newClient(t, srv.URL, &client.RetryPolicy{MaxAttempts: 5, MaxDelay: 5 * time.Millisecond})
	_, err := c.Start(context.Background(), "resize", "images", nil, client.StartOptions{})
	require.NoError(t, err)
	require.Equal(t, 3, f.count())
}

// Retrying stops when ctx ends: while waiting, and before a wait that ctx
// would not outlast.
func TestRetryStopsAtContextEnd(t *testing.T) {
	t.Parallel()
	t.Run("cancelled while waiting", func(t *testing.T) {
		t.Parallel()
		// An hour's Retry-After: only the cancel can end this wait, so
		// the call returning at all shows that it did (no clock bound).
		f, srv := newFake(t, fakeAnswer{status: http.StatusServiceUnavailable, code: api.CodeUnavailable, retryAfter: "3600"})
		c := newClient(t, srv.URL, &client.RetryPolicy{MaxAttempts: 100, MaxDelay: 2 * time.Hour})
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			for f.count() == 0 {
				time.Sleep(time.Millisecond)
			}
			cancel()
		}()
		_, err := c.Get(ctx, "r1")
		// ctx may end while the first answer is still on its way: then
		// the error is ctx's rather than the 503's.
		require.True(t, errors.Is(err, client.ErrUnavailable) || errors.Is(err, context.Canceled), "%v", err)
		require.Equal(t, 1, f.count())
	})
	t.Run("deadline before the next attempt", func(t *testing.T) {
		t.Parallel()
		f, srv := newFake(t, fakeAnswer{status: http.StatusTooManyRequests, code: api.CodeOverLimit, retryAfter: "3"})
		c := newClient(t, srv.URL, &client.RetryPolicy{MaxAttempts: 100, MaxDelay: 5 * time.Second})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.Get(ctx, "r1")
		require.ErrorIs(t, err, client.ErrOverLimit)
		var ce *client.Error
		require.ErrorAs(t, err, &ce)
		require.Equal(t, 3*time.Second, ce.RetryAfter())
		require.Equal(t, 1, f.count(), "no wait ctx cannot outlast")
		require.NoError(t, ctx.Err(), "answered at once")
	})
	t.Run("backoff until the deadline", func(t *testing.T) {
		t.Parallel()
		f, srv := newFake(t, fakeAnswer{status: http.StatusServiceUnavailable})
		c := newClient(t, srv.URL, &client.RetryPolicy{MaxAttempts: 1000, MaxDelay: 10 * time.Millisecond})
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, err := c.Get(ctx, "r1")
		// The deadline may fall during an attempt rather than a wait.
		require.True(t, errors.Is(err, client.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded), "%v", err)
		require.Greater(t, f.count(), 1)
		require.Less(t, f.count(), 1000)
	})
}

// A Retry-After longer than MaxDelay ends the retries: coming back sooner
// would be refused again.
func TestRetryGivesUpOnLongRetryAfter(t *testing.T) {
	t.Parallel()
	f, srv := newFake(t, fakeAnswer{status: http.StatusTooManyRequests, code: api.CodeOverLimit, retryAfter: "60"})
	c := newClient(t, srv.URL, &client.RetryPolicy{MaxAttempts: 5, MaxDelay: time.Second})
	_, err := c.Get(context.Background(), "r1")
	require.ErrorIs(t, err, client.ErrOverLimit)
	require.Equal(t, 1, f.count())
}

// failingTransport fails the first fails round trips, as a reset
// connection would, then passes them on.
type failingTransport struct {
	fails atomic.Int32
}

func (ft *failingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if ft.fails.Add(-1) >= 0 {
		return nil, errors.New("connection reset by peer")
	}
	return http.DefaultTransport.RoundTrip(r)
}

// A transport failure is retried for reads and starts (which carry their
// id) but not for Cancel, whose repeat could be refused as final.
func TestTransportErrorRetriedWhenSafe(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		call  func(*client.Client) error
		tries int
	}{
		{"get", func(c *client.Client) error { _, err := c.Get(context.Background(), "r1"); return err }, 2},
		{"start", func(c *client.Client) error {
			_, err := c.Start(context.Background(), "n", "q", nil, client.StartOptions{})
			return err
		}, 2},
		{"cancel", func(c *client.Client) error { _, err := c.Cancel(context.Background(), "r1"); return err }, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, srv := newFake(t)
			ft := &failingTransport{}
			ft.fails.Store(1)
			c, err := client.New(client.Options{URL: srv.URL, HTTPClient: &http.Client{Transport: ft},
				Retry: &client.RetryPolicy{MaxAttempts: 3, MaxDelay: time.Millisecond}})
			require.NoError(t, err)
			err = tc.call(c)
			if tc.tries == 1 {
				require.ErrorContains(t, err, "connection reset")
				require.Equal(t, 0, f.count())
				return
			}
			require.NoError(t, err)
			require.Equal(t, 1, f.count(), "the second attempt reached the gateway")
		})
	}
}

// Each refusal matches its sentinel with errors.Is, and no other, while
// errors.As still finds the *api.Error.
func TestErrorSentinels(t *testing.T) {
	t.Parallel()
	all := []error{client.ErrOverLimit, client.ErrNotFound, client.ErrUnavailable, client.ErrUnauthorized,
		client.ErrForbidden, client.ErrConflict, client.ErrInvalid}
	for _, tc := range []struct {
		status int
		code   api.Code
		want   error
	}{
		{http.StatusTooManyRequests, api.CodeOverLimit, client.ErrOverLimit},
		{http.StatusNotFound, api.CodeNotFound, client.ErrNotFound},
		{http.StatusServiceUnavailable, api.CodeUnavailable, client.ErrUnavailable},
		{http.StatusUnauthorized, api.CodeUnauthenticated, client.ErrUnauthorized},
		{http.StatusForbidden, api.CodePermissionDenied, client.ErrForbidden},
		{http.StatusConflict, api.CodeConflict, client.ErrConflict},
		{http.StatusBadRequest, api.CodeInvalidArgument, client.ErrInvalid},
		{http.StatusUnprocessableEntity, "", client.ErrInvalid},
		{http.StatusNotFound, "", client.ErrNotFound}, // a body that is not the API's
	} {
		t.Run(fmt.Sprintf("%d %s", tc.status, tc.code), func(t *testing.T) {
			t.Parallel()
			_, srv := newFake(t, fakeAnswer{status: tc.status, code: tc.code, retryAfter: "2"})
			c := newClient(t, srv.URL, nil)
			_, err := c.Get(context.Background(), "r1")
			require.ErrorIs(t, err, tc.want)
			for _, other := range all {
				if other != tc.want {
					require.NotErrorIs(t, err, other)
				}
			}
			var ae *api.Error
			require.ErrorAs(t, err, &ae)
			require.Equal(t, tc.status, ae.Status)
			var ce *client.Error
			require.ErrorAs(t, err, &ce)
			require.Equal(t, 2*time.Second, ce.RetryAfter())
		})
	}
}

// Without the header, RetryAfter falls back to the body's retry_after_ms.
func TestRetryAfterFromBody(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTooManyRequests)
		_ = json.NewEncoder(w).Encode(api.ErrorBody{Error: &api.Error{Status: 429, Code: api.CodeOverLimit, RetryAfterMS: 250}})
	}))
	t.Cleanup(srv.Close)
	_, err := newClient(t, srv.URL, nil).Get(context.Background(), "r1")
	var ce *client.Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, 250*time.Millisecond, ce.RetryAfter())
}

// New names the policy field that is wrong.
func TestNewValidatesRetryPolicy(t *testing.T) {
	t.Parallel()
	_, err := client.New(client.Options{URL: "http://x", Retry: &client.RetryPolicy{}})
	require.ErrorContains(t, err, "Options.Retry.MaxAttempts")
	_, err = client.New(client.Options{URL: "http://x", Retry: &client.RetryPolicy{MaxAttempts: 2, MaxDelay: -time.Second}})
	require.ErrorContains(t, err, "Options.Retry.MaxDelay")
	_, err = client.New(client.Options{URL: "http://x", Retry: &client.RetryPolicy{MaxAttempts: 1}})
	require.NoError(t, err)
}

// An HTTP call made inside a span carries its W3C trace context, so the
// gateway's spans join the caller's trace.
func TestHTTPCarriesTraceparent(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("test").Start(context.Background(), "caller")
	defer span.End()

	f, srv := newFake(t)
	_, err := newClient(t, srv.URL, nil).Start(ctx, "n", "q", nil, client.StartOptions{})
	require.NoError(t, err)
	f.mu.Lock()
	tp0 := f.got[0].Header.Get("traceparent")
	f.mu.Unlock()
	sc := span.SpanContext()
	require.Equal(t, fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID()), tp0)

	// Without a span there is nothing to carry.
	_, err = newClient(t, srv.URL, nil).Get(context.Background(), "r1")
	require.NoError(t, err)
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Empty(t, f.got[1].Header.Get("traceparent"))
}
