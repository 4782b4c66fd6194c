package client

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"

	"github.com/harvest-run/harvest/pkg/api"
)

// The operator calls below go over HTTP only and need a token with the
// privilege each names. Writes of weights and quotas touch every shard:
// their result is returned without error when some shard did not take the
// write (HTTP 207, 409, 503 with the per-shard body), so check its
// Status(): 200 every shard, 207 some (send again), 409 refused at the
// override cap, 503 none.

// GetWeights reads the weight overrides of queue on every shard
// (weights:read). A 503 result (no shard answered) is returned without
// error; its Status() says so.
func (c *Client) GetWeights(ctx context.Context, queue string) (api.WeightReadResult, error) {
	var out api.WeightReadResult
	err := c.fanoutCall(ctx, http.MethodGet, queuePath(queue, "weights"), nil, nil, &out)
	return out, err
}

// SetWeight sets the override of key in queue on every shard
// (weights:write).
func (c *Client) SetWeight(ctx context.Context, queue, key string, weight float64) (api.WeightWriteResult, error) {
	var out api.WeightWriteResult
	err := c.fanoutCall(ctx, http.MethodPut, queuePath(queue, "weights", key), nil, api.WeightBody{Weight: &weight}, &out)
	return out, err
}

// ClearWeight removes the override of key in queue on every shard
// (weights:write); the key weighs 1 again.
func (c *Client) ClearWeight(ctx context.Context, queue, key string) (api.WeightWriteResult, error) {
	var out api.WeightWriteResult
	err := c.fanoutCall(ctx, http.MethodDelete, queuePath(queue, "weights", key), nil, nil, &out)
	return out, err
}

// GetQuota reads the quota of quotaKey in queue on every shard, or every
// quota of the queue when quotaKey is empty (weights:read).
func (c *Client) GetQuota(ctx context.Context, queue, quotaKey string) (api.QuotaReadResult, error) {
	path := queuePath(queue, "quotas")
	if quotaKey != "" {
		path = queuePath(queue, "quotas", quotaKey)
	}
	var out api.QuotaReadResult
	err := c.fanoutCall(ctx, http.MethodGet, path, nil, nil, &out)
	return out, err
}

// SetQuota replaces the quota of quotaKey in queue on every shard
// (weights:write): a limit left nil is removed.
func (c *Client) SetQuota(ctx context.Context, queue, quotaKey string, q api.Quota) (api.QuotaWriteResult, error) {
	var out api.QuotaWriteResult
	err := c.fanoutCall(ctx, http.MethodPut, queuePath(queue, "quotas", quotaKey), nil, q, &out)
	return out, err
}

// ClearQuota removes the quota of quotaKey in queue on every shard
// (weights:write).
func (c *Client) ClearQuota(ctx context.Context, queue, quotaKey string) (api.QuotaWriteResult, error) {
	var out api.QuotaWriteResult
	err := c.fanoutCall(ctx, http.MethodDelete, queuePath(queue, "quotas", quotaKey), nil, nil, &out)
	return out, err
}

// Keys lists, per shard, the keys of queue with their weight, pass, lag,
// pending tasks and claims in the last minute (weights:read). limit <= 0
// takes the server's default.
func (c *Client) Keys(ctx context.Context, queue string, limit int) (api.KeysResult, error) {
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out api.KeysResult
	err := c.fanoutCall(ctx, http.MethodGet, queuePath(queue, "keys"), q, nil, &out)
	return out, err
}

// PauseQueue pauses queue on every shard (weights:write): workers claim
// none of its tasks until ResumeQueue, and starts are still accepted. When
// it returns with every shard's outcome ok, no claim is still taking the
// queue's tasks. A 207 or 503 result is returned, not an error: send the
// same call again (it is idempotent) to reach the shards in
// UnavailableShards.
func (c *Client) PauseQueue(ctx context.Context, queue string) (api.QueuePauseResult, error) {
	var out api.QueuePauseResult
	err := c.fanoutCall(ctx, http.MethodPost, queuePath(queue, "pause"), nil, nil, &out)
	return out, err
}

// ResumeQueue resumes a paused queue on every shard (weights:write) and
// wakes its workers; the result follows the rules of PauseQueue.
func (c *Client) ResumeQueue(ctx context.Context, queue string) (api.QueuePauseResult, error) {
	var out api.QueuePauseResult
	err := c.fanoutCall(ctx, http.MethodPost, queuePath(queue, "resume"), nil, nil, &out)
	return out, err
}

// AuditEntry is one row of GET /v1/audit with the shard it lives on.
type AuditEntry struct {
	Shard int `json:"shard"`
	api.AuditEntry
}

// AuditPage is one page of GET /v1/audit, newest first across shards.
type AuditPage struct {
	Entries           []AuditEntry `json:"entries"`
	NextCursor        string       `json:"next_cursor"`
	UnavailableShards []int        `json:"unavailable_shards"`
}

// AuditOptions page the audit log; zero values take the defaults.
type AuditOptions struct {
	Limit  int
	Cursor string
	// Shard, when set, lists that shard's rows only.
	Shard *int
}

// Audit reads a page of the audit log (config:read). Pass the page's
// NextCursor as Cursor for the next (older) page.
func (c *Client) Audit(ctx context.Context, o AuditOptions) (AuditPage, error) {
	q := url.Values{}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.Cursor != "" {
		q.Set("cursor", o.Cursor)
	}
	if o.Shard != nil {
		q.Set("shard", strconv.Itoa(*o.Shard))
	}
	var out AuditPage
	_, err := c.httpCall(ctx, http.MethodGet, "/v1/audit", q, nil, &out)
	return out, err
}

// Admission reads the admission configuration and the running counts
// (config:read).
func (c *Client) Admission(ctx context.Context) (api.AdmissionView, error) {
	var out api.AdmissionView
	_, err := c.httpCall(ctx, http.MethodGet, "/v1/admission", nil, nil, &out)
	return out, err
}

// AdmissionChange is the body of PUT /v1/admission: nil fields are left
// as they are.
type AdmissionChange struct {
	Algorithm *api.Algorithm `json:"algorithm,omitempty"`
	TFM       *float64       `json:"tfm,omitempty"`
	// ScheduledShare is the share of a tenant's budget its runs not due
	// yet may hold, above 0 and at most 1.
	ScheduledShare *float64 `json:"scheduled_share,omitempty"`
}

// SetAdmission changes the algorithm, the TFM or both (config:write) and
// returns the view with the change in force. Every gateway applies it to
// its next start.
func (c *Client) SetAdmission(ctx context.Context, ch AdmissionChange) (api.AdmissionView, error) {
	var out api.AdmissionView
	_, err := c.httpCall(ctx, http.MethodPut, "/v1/admission", nil, ch, &out)
	return out, err
}

// PriorityCeiling reads the highest priority tenant's starts may carry
// (config:read).
func (c *Client) PriorityCeiling(ctx context.Context, tenant string) (api.PriorityCeiling, error) {
	var out api.PriorityCeiling
	_, err := c.httpCall(ctx, http.MethodGet, tenantPath(tenant, "priority"), nil, nil, &out)
	return out, err
}

// SetPriorityCeiling lets tenant's starts carry priorities up to
// maxPriority (config:write). Every gateway applies it to its next start.
func (c *Client) SetPriorityCeiling(ctx context.Context, tenant string, maxPriority int) (api.PriorityCeiling, error) {
	var out api.PriorityCeiling
	_, err := c.httpCall(ctx, http.MethodPut, tenantPath(tenant, "priority"), nil,
		api.PriorityCeilingRequest{MaxPriority: &maxPriority}, &out)
	return out, err
}

// ClearPriorityCeiling puts tenant back to api.DefaultMaxPriority
// (config:write).
func (c *Client) ClearPriorityCeiling(ctx context.Context, tenant string) (api.PriorityCeiling, error) {
	var out api.PriorityCeiling
	_, err := c.httpCall(ctx, http.MethodDelete, tenantPath(tenant, "priority"), nil, nil, &out)
	return out, err
}

func tenantPath(tenant, kind string) string {
	return "/v1/tenants/" + url.PathEscape(tenant) + "/" + kind
}

// Usage reads the caller's tenant's unfinished runs and its limit now
// (runs:read, a tenant's token).
func (c *Client) Usage(ctx context.Context) (api.UsageView, error) {
	var out api.UsageView
	_, err := c.httpCall(ctx, http.MethodGet, "/v1/usage", nil, nil, &out)
	return out, err
}

// queuePath builds /v1/queues/{queue}/{kind}[/{key}] with each value
// escaped as one path segment.
func queuePath(queue, kind string, key ...string) string {
	p := "/v1/queues/" + url.PathEscape(queue) + "/" + kind
	for _, k := range key {
		p += "/" + url.PathEscape(k)
	}
	return p
}

// fanoutCall is httpCall for the routes that answer a multi-shard result
// with 207, 409 or 503: such a body (one without "error") is decoded into
// out and is not an error.
func (c *Client) fanoutCall(ctx context.Context, method, path string, q url.Values, in, out any) error {
	ans, err := c.httpRaw(ctx, method, path, q, in, method != http.MethodPost)
	if err != nil {
		return err
	}
	switch ans.status {
	case http.StatusMultiStatus, http.StatusConflict, http.StatusServiceUnavailable:
		var probe map[string]json.RawMessage
		if json.Unmarshal(ans.data, &probe) == nil && probe != nil {
			if _, isErr := probe["error"]; !isErr {
				return json.NewDecoder(bytes.NewReader(ans.data)).Decode(out)
			}
		}
	}
	return decodeAnswer(ans, out)
}
