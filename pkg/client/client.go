package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/dispatch"
)

// StatusHeader is the NATS header in which the gateway puts the HTTP status
// of its answer (201 for a new run, 200 for a replay).
const StatusHeader = "Harvest-Status"

// DefaultNATSTimeout bounds a NATS request whose context has no deadline.
const DefaultNATSTimeout = 10 * time.Second

// Options configure a Client. Set URL (and Token) for HTTP, NATS (and
// Tenant) for NATS, or both.
type Options struct {
	// URL is the gateway's base URL, such as http://127.0.0.1:8080.
	URL string
	// Token is the bearer secret sent over HTTP.
	Token string
	// HTTPClient is used for HTTP calls; nil means a client without an
	// overall timeout (contexts bound the calls).
	HTTPClient *http.Client
	// NATS, when set, carries starts and batch starts.
	NATS *nats.Conn
	// Tenant is the tenant whose start subjects NATS requests go to.
	Tenant string
	// SubjectPrefix is the first token of Harvest's subjects; "harvest"
	// when empty.
	SubjectPrefix string
	// NATSTimeout bounds NATS requests whose context has no deadline.
	NATSTimeout time.Duration
	// Retry, when set, sends a call again on 429 and 503 answers and on
	// transport failures of calls safe to repeat (see RetryPolicy); nil
	// sends every call once.
	Retry *RetryPolicy
}

// Client talks to Harvest's gateways. It is safe for concurrent use.
type Client struct {
	base     *url.URL
	token    string
	hc       *http.Client
	nc       *nats.Conn
	tenant   string
	subjects dispatch.Subjects
	timeout  time.Duration
	retry    *RetryPolicy
	// ownInbox: the connection's own inbox prefix is the tenant's, so its
	// request multiplexer gets the answers; otherwise replies does.
	ownInbox bool
	replies  replies
}

// New checks opts and returns a client.
func New(opts Options) (*Client, error) {
	c := &Client{token: opts.Token, hc: opts.HTTPClient, nc: opts.NATS, tenant: opts.Tenant,
		subjects: dispatch.Subjects{Prefix: opts.SubjectPrefix}, timeout: opts.NATSTimeout}
	if opts.Retry != nil {
		if err := opts.Retry.check(); err != nil {
			return nil, err
		}
		// A copy: the caller changing its policy later must not race
		// with calls in flight.
		p := *opts.Retry
		c.retry = &p
	}
	if opts.URL == "" && opts.NATS == nil {
		return nil, errors.New("client: set Options.URL (HTTP) or Options.NATS")
	}
	if opts.URL != "" {
		u, err := url.Parse(strings.TrimRight(opts.URL, "/"))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("client: URL %q is not an http(s) URL", opts.URL)
		}
		c.base = u
	}
	if opts.NATS != nil && opts.Tenant == "" {
		return nil, errors.New("client: Options.Tenant is required with Options.NATS")
	}
	if opts.NATS != nil {
		c.ownInbox = strings.HasPrefix(opts.NATS.NewRespInbox(), inboxPrefix(opts.Tenant)+".")
	}
	if c.hc == nil {
		c.hc = &http.Client{}
	}
	if c.timeout <= 0 {
		c.timeout = DefaultNATSTimeout
	}
	return c, nil
}

// StartOptions are the optional parts of a start.
type StartOptions struct {
	// ID is the idempotency key (unique per tenant); the client makes a
	// UUIDv7 when it is empty (see StartRequest). Sending the same start
	// with the same ID again returns the same run.
	ID string
	// FairnessKey names whose share of the queue the run uses; empty
	// leaves it unset (the quota key, else the default key, stands in).
	FairnessKey string
	// QuotaKey names the concurrency cap and rate limit the run counts
	// against; empty leaves it unset.
	QuotaKey string
	// Priority is from -1000 to 1000, higher first.
	Priority int
	// RunAt or Delay postpone the run (set at most one).
	RunAt time.Time
	Delay time.Duration
	// Timeout bounds one attempt of the run's tasks; zero: none.
	Timeout time.Duration
	// MaxAttempts bounds the attempts; zero: the server's default.
	MaxAttempts int
	// Notify asks for the run's final state on NATS
	// (harvest.runs.<tenant>.<run_id>) for subscribers of that subject;
	// without it none is published. Wait does not need it.
	Notify bool

	// Throttle, Debounce and Batch defer the start (set at most one; see
	// docs/deferred.md). A deferred start cannot set FairnessKey, RunAt or
	// Delay: its run fires later and takes QuotaKey as its fairness key.
	// The answer then has DeferMode and RunID set, and while the start
	// waits, Status deferred and FiresAt, the latest time it fires.
	//
	// Throttle: at most Limit runs of the key start per Period; the rest
	// wait in arrival order.
	Throttle *api.ThrottleSpec
	// Debounce: one run Period after the last start of the key (capped by
	// MaxWait from the first), with the last start's request.
	Debounce *api.DebounceSpec
	// Batch: one run whose input is the list of the gathered starts'
	// inputs, at MaxSize starts or MaxWait after the first.
	Batch *api.BatchSpec
}

// Throttle returns the throttle option: at most limit runs per period for
// key (within the tenant and queue).
func Throttle(key string, limit int, period time.Duration) *api.ThrottleSpec {
	return &api.ThrottleSpec{Key: key, Limit: limit, Period: api.Duration(period)}
}

// Debounce returns the debounce option: the run fires period after the
// last start of key; maxWait (zero: no cap) bounds the wait from the first.
func Debounce(key string, period, maxWait time.Duration) *api.DebounceSpec {
	d := &api.DebounceSpec{Key: key, Period: api.Duration(period)}
	if maxWait > 0 {
		mw := api.Duration(maxWait)
		d.MaxWait = &mw
	}
	return d
}

// Batch returns the batch option: starts of key gather into one run of at
// most maxSize inputs, fired maxWait after the first at the latest.
func Batch(key string, maxSize int, maxWait time.Duration) *api.BatchSpec {
	return &api.BatchSpec{Key: key, MaxSize: maxSize, MaxWait: api.Duration(maxWait)}
}

// Request builds the API start request of a run of workflow name on queue
// with input (any JSON-encodable value; json.RawMessage is sent as it is).
func (o StartOptions) Request(name, queue string, input any) (api.StartRequest, error) {
	req := api.StartRequest{ID: o.ID, Name: name, Queue: queue, Priority: o.Priority, Notify: o.Notify}
	if input != nil {
		if raw, ok := input.(json.RawMessage); ok {
			req.Input = raw
		} else {
			b, err := json.Marshal(input)
			if err != nil {
				return api.StartRequest{}, fmt.Errorf("client: encode input: %w", err)
			}
			req.Input = b
		}
	}
	if o.FairnessKey != "" {
		req.FairnessKey = &o.FairnessKey
	}
	if o.QuotaKey != "" {
		req.QuotaKey = &o.QuotaKey
	}
	if !o.RunAt.IsZero() {
		req.RunAt = &api.Time{Time: o.RunAt}
	}
	if o.Delay != 0 {
		d := api.Duration(o.Delay)
		req.Delay = &d
	}
	if o.Timeout != 0 {
		d := api.Duration(o.Timeout)
		req.Timeout = &d
	}
	if o.MaxAttempts != 0 {
		n := o.MaxAttempts
		req.MaxAttempts = &n
	}
	if err := encodeSpec(&req.Throttle, o.Throttle); err != nil {
		return api.StartRequest{}, err
	}
	if err := encodeSpec(&req.Debounce, o.Debounce); err != nil {
		return api.StartRequest{}, err
	}
	if err := encodeSpec(&req.Batch, o.Batch); err != nil {
		return api.StartRequest{}, err
	}
	return req, nil
}

// encodeSpec sets a deferral field of a request from its typed option.
func encodeSpec[T any](dst *json.RawMessage, spec *T) error {
	if spec == nil {
		return nil
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("client: encode deferral: %w", err)
	}
	*dst = b
	return nil
}

// Started is the answer to a start.
type Started struct {
	Run api.Run
	// Created is true for a new run, false when the start replayed one
	// that existed with the same id and request.
	Created bool
}

// Deferred reports whether the start waits to fire (status deferred); then
// Run.FiresAt is the latest time it fires and Run.RunID the run it fires.
func (s Started) Deferred() bool { return s.Run.Status == api.StatusDeferred }

// Start starts a run of workflow name on queue with input.
func (c *Client) Start(ctx context.Context, name, queue string, input any, o StartOptions) (Started, error) {
	req, err := o.Request(name, queue, input)
	if err != nil {
		return Started{}, err
	}
	return c.StartRequest(ctx, req)
}

// StartRequest sends a start request as it is, except that an empty
// req.ID is filled with a new UUIDv7 before the first attempt. The client
// rather than the gateway picks the id so that a start whose answer was
// lost (a timeout, a reset connection, a 503 after the run was written)
// can be sent again under the same id: the gateway then returns the run
// the first attempt made (Created false) instead of starting a second
// one, and answers 409 (ErrConflict) only if the id was used with a
// different request. The returned Run.ID is that id.
func (c *Client) StartRequest(ctx context.Context, req api.StartRequest) (Started, error) {
	if err := fillID(&req); err != nil {
		return Started{}, err
	}
	var run api.Run
	var status int
	var err error
	if c.nc != nil {
		status, err = c.natsCall(ctx, c.subjects.Start(c.tenant), req, &run)
	} else {
		status, err = c.httpCallSafe(ctx, http.MethodPost, "/v1/runs", nil, req, &run, true)
	}
	if err != nil {
		return Started{}, err
	}
	return Started{Run: run, Created: status == http.StatusCreated}, nil
}

// StartBatch starts many runs at once (at most api.MaxBatchItems). Each
// result holds its run or its own error, in the order of reqs; the error
// return is for the call as a whole. As in StartRequest, each request
// without an id gets a UUIDv7 before the first attempt (reqs itself is not
// changed), so a retried batch replays the runs it already made.
func (c *Client) StartBatch(ctx context.Context, reqs []api.StartRequest) ([]api.BatchResult, error) {
	reqs = append([]api.StartRequest{}, reqs...)
	for i := range reqs {
		if err := fillID(&reqs[i]); err != nil {
			return nil, err
		}
	}
	body := api.BatchStartRequest{Runs: reqs}
	var out api.BatchStartResponse
	var err error
	if c.nc != nil {
		_, err = c.natsCall(ctx, c.subjects.StartBatch(c.tenant), body, &out)
	} else {
		_, err = c.httpCallSafe(ctx, http.MethodPost, "/v1/runs/batch", nil, body, &out, true)
	}
	return out.Results, err
}

// Get reads a run, or what the id of a deferred start stands for: status
// deferred with FiresAt while it waits, then the run it fired (for the
// starts of a debounce window or batch, Run.ID is the start's id and
// Run.RunID the run's).
func (c *Client) Get(ctx context.Context, id string) (api.Run, error) {
	var run api.Run
	_, err := c.httpCall(ctx, http.MethodGet, "/v1/runs/"+url.PathEscape(id), nil, nil, &run)
	return run, err
}

// Wait reads a run once it is final, or as it stands when wait ends (the
// gateway caps one wait; Wait asks again until ctx ends or the run is
// final when wait is longer).
func (c *Client) Wait(ctx context.Context, id string, wait time.Duration) (api.Run, error) {
	deadline := time.Now().Add(wait)
	for {
		left := time.Until(deadline)
		q := url.Values{"wait": {max(left, 0).Round(time.Millisecond).String()}}
		var run api.Run
		if _, err := c.httpCall(ctx, http.MethodGet, "/v1/runs/"+url.PathEscape(id), q, nil, &run); err != nil {
			return run, err
		}
		if run.Status.Final() || time.Until(deadline) <= 0 {
			return run, nil
		}
	}
}

// ListOptions filter and page a listing; zero fields do not filter.
type ListOptions struct {
	Statuses []api.Status
	Queue    string
	Name     string
	Limit    int
	Cursor   string
}

// List returns a page of the tenant's runs, newest first. Pass the page's
// NextCursor as Cursor for the next one, until it is empty: a page is
// bounded in bytes as well as by Limit, so it may hold fewer runs than
// Limit and still not be the last. Listed runs carry no Output; Get reads
// a run's output.
func (c *Client) List(ctx context.Context, o ListOptions) (api.RunList, error) {
	q := url.Values{}
	if len(o.Statuses) > 0 {
		ss := make([]string, len(o.Statuses))
		for i, s := range o.Statuses {
			ss[i] = string(s)
		}
		q.Set("status", strings.Join(ss, ","))
	}
	if o.Queue != "" {
		q.Set("queue", o.Queue)
	}
	if o.Name != "" {
		q.Set("name", o.Name)
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.Cursor != "" {
		q.Set("cursor", o.Cursor)
	}
	var out api.RunList
	_, err := c.httpCall(ctx, http.MethodGet, "/v1/runs", q, nil, &out)
	return out, err
}

// Cancel cancels a run and returns it. A queued run is cancelled at once;
// a running one's worker learns of it at its next heartbeat and its result
// is discarded. A run that already completed or failed gives a 409 error.
// The id of a deferred start cancels the run it stands for: a waiting
// throttled start never fires, and a debounce window or batch (named by
// any of its starts) is cancelled as a whole.
func (c *Client) Cancel(ctx context.Context, id string) (api.Run, error) {
	var run api.Run
	_, err := c.httpCall(ctx, http.MethodPost, "/v1/runs/"+url.PathEscape(id)+"/cancel", nil, nil, &run)
	return run, err
}

// Retry puts a failed or cancelled run back in its queue and returns it,
// queued: its attempts are kept and counted on, its last task runs again
// with a fresh budget of attempts, and the run takes an admission slot as
// a start does (429 when the tenant is at its limit). A run in any other
// status, or a deferred start cancelled before it fired, gives a 409
// error. The call is not repeated on a transport error: a retry that did
// reach the gateway would be answered 409 the second time.
func (c *Client) Retry(ctx context.Context, id string) (api.Run, error) {
	var run api.Run
	_, err := c.httpCall(ctx, http.MethodPost, "/v1/runs/"+url.PathEscape(id)+"/retry", nil, nil, &run)
	return run, err
}

// fillID gives a start without an id a UUIDv7, the form the gateway would
// have made, so that every attempt of the call carries the same id.
func fillID(req *api.StartRequest) error {
	if req.ID != "" {
		return nil
	}
	id, err := uuid.NewV7()
	if err != nil {
		return fmt.Errorf("client: make a run id: %w", err)
	}
	req.ID = id.String()
	return nil
}

// propagator writes the caller's W3C trace context (and baggage) into
// HTTP headers, as pkg/dispatch does into NATS headers. It is fixed rather
// than otel's global one, which is a no-op until a program sets it: the
// gateway's spans join the caller's trace whatever the program set up.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// answer is what one HTTP exchange returned.
type answer struct {
	status int
	data   []byte
	// retryAfter is the Retry-After header's wait, zero when absent.
	retryAfter time.Duration
}

// httpCall sends an HTTP request (again, under the retry policy, when the
// method is safe to repeat) and decodes the answer into out, or returns
// the API error.
func (c *Client) httpCall(ctx context.Context, method, path string, q url.Values, in, out any) (int, error) {
	return c.httpCallSafe(ctx, method, path, q, in, out, method != http.MethodPost)
}

// httpCallSafe is httpCall with the caller saying whether the call may be
// repeated after a transport failure (starts may: they carry their id).
func (c *Client) httpCallSafe(ctx context.Context, method, path string, q url.Values, in, out any, safe bool) (int, error) {
	ans, err := c.httpRaw(ctx, method, path, q, in, safe)
	if err != nil {
		return ans.status, err
	}
	return ans.status, decodeAnswer(ans, out)
}

// httpRaw sends an HTTP request, retrying under the policy, and returns the
// last answer. path must be escaped already (values go through
// url.PathEscape). safe says whether a transport failure may be retried;
// 429 and 503 answers always may, since the gateway did not act on them.
func (c *Client) httpRaw(ctx context.Context, method, path string, q url.Values, in any, safe bool) (answer, error) {
	if c.base == nil {
		return answer{}, fmt.Errorf("client: %s %s needs Options.URL (HTTP)", method, path)
	}
	target := c.base.String() + path
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	var body []byte
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return answer{}, fmt.Errorf("client: encode request: %w", err)
		}
		body = b
	}
	for n := 1; ; n++ {
		ans, err := c.httpOnce(ctx, method, path, target, in != nil, body)
		var retry bool
		hint := ans.retryAfter
		if err != nil {
			retry = safe && ctx.Err() == nil
		} else if retryable(ans.status) {
			retry = true
			if e := probeError(ans.data); hint == 0 && e != nil {
				hint = time.Duration(e.RetryAfterMS) * time.Millisecond
			}
		}
		if !c.again(ctx, n, retry, hint) {
			return ans, err
		}
	}
}

// httpOnce is one HTTP exchange.
func (c *Client) httpOnce(ctx context.Context, method, path, target string, hasBody bool, body []byte) (answer, error) {
	var rd io.Reader
	if hasBody {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return answer{}, fmt.Errorf("client: %w", err)
	}
	if hasBody {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	propagator.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := c.hc.Do(req)
	if err != nil {
		return answer{}, fmt.Errorf("client: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	ans := answer{status: resp.StatusCode, retryAfter: parseRetryAfter(resp.Header.Get("Retry-After"))}
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return ans, fmt.Errorf("client: %s %s: read answer: %w", method, path, err)
	}
	ans.data = data
	return ans, nil
}

// natsCall sends a NATS request, retrying under the policy (only starts go
// over NATS, and they carry their id, so every failure may be retried),
// and decodes the answer into out.
func (c *Client) natsCall(ctx context.Context, subject string, in, out any) (int, error) {
	for n := 1; ; n++ {
		status, transport, err := c.natsOnce(ctx, subject, in, out)
		var hint time.Duration
		retry := transport && ctx.Err() == nil
		var ae *api.Error
		if errors.As(err, &ae) && retryable(ae.Status) {
			retry, hint = true, time.Duration(ae.RetryAfterMS)*time.Millisecond
		}
		if !c.again(ctx, n, retry, hint) {
			return status, err
		}
	}
}

// natsOnce is one NATS request; transport reports a failure of the request
// itself (no answer), as opposed to an answer that is an error.
func (c *Client) natsOnce(ctx context.Context, subject string, in, out any) (status int, transport bool, err error) {
	if _, ok := ctx.Deadline(); !ok {
		// Per attempt, so that a retry gets its own time.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	msg, err := dispatch.NewMsg(ctx, subject, in)
	if err != nil {
		return 0, false, err
	}
	var resp *nats.Msg
	if c.ownInbox {
		resp, err = c.nc.RequestMsgWithContext(ctx, msg)
	} else {
		resp, err = c.replies.request(ctx, c.nc, c.tenant, msg)
	}
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return 0, false, &Error{API: &api.Error{Status: http.StatusServiceUnavailable, Code: api.CodeUnavailable,
				Message: "no gateway listens on " + subject}}
		}
		return 0, true, fmt.Errorf("client: request %s: %w", subject, err)
	}
	status = http.StatusOK
	if s := resp.Header.Get(StatusHeader); s != "" {
		if n, err := strconv.Atoi(s); err == nil {
			status = n
		}
	} else if err := probeError(resp.Data); err != nil {
		// An answer without the status header may still be an error.
		return err.Status, false, &Error{API: err}
	}
	return status, false, decodeAnswer(answer{status: status, data: resp.Data}, out)
}

// probeError returns the error an answer of unknown status holds, if any.
func probeError(data []byte) *api.Error {
	var probe api.ErrorBody
	if json.Unmarshal(data, &probe) == nil && probe.Error != nil && probe.Error.Code != "" {
		return probe.Error
	}
	return nil
}

// decodeAnswer reads a success into out, or an error body into *Error.
func decodeAnswer(ans answer, out any) error {
	status, data := ans.status, ans.data
	if status >= 200 && status < 300 {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("client: decode answer: %w", err)
		}
		return nil
	}
	var eb api.ErrorBody
	if json.Unmarshal(data, &eb) == nil && eb.Error != nil {
		if eb.Error.Status == 0 {
			eb.Error.Status = status
		}
		return &Error{API: eb.Error, retryAfter: ans.retryAfter}
	}
	return &Error{API: &api.Error{Status: status, Code: codeFor(status),
		Message: fmt.Sprintf("HTTP %d: %s", status, strings.TrimSpace(string(truncate(data, 200))))},
		retryAfter: ans.retryAfter}
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

func codeFor(status int) api.Code {
	for _, c := range []api.Code{api.CodeInvalidArgument, api.CodeUnauthenticated, api.CodePermissionDenied,
		api.CodeNotFound, api.CodeConflict, api.CodePayloadTooLarge, api.CodeOverLimit, api.CodeUnavailable} {
		if c.Status() == status {
			return c
		}
	}
	return api.CodeInternal
}
