package client

import (
	"context"
	"net/http"

	"github.com/harvest-run/harvest/pkg/api"
)

// QueueFairness reads a queue's fairness modes on every shard
// (weights:read): two-level or not, and what a claim is charged.
func (c *Client) QueueFairness(ctx context.Context, queue string) (api.QueueFairnessResult, error) {
	var out api.QueueFairnessResult
	err := c.fanoutCall(ctx, http.MethodGet, queuePath(queue, "fairness"), nil, nil, &out)
	return out, err
}

// SetQueueFairness changes a queue's fairness modes on every shard
// (weights:write, an operator's token); a nil field of req keeps its
// value. A 207 or 503 result is returned, not an error: send the call
// again (it is idempotent) for the shards in UnavailableShards.
func (c *Client) SetQueueFairness(ctx context.Context, queue string, req api.QueueFairnessRequest) (api.QueueFairnessResult, error) {
	var out api.QueueFairnessResult
	err := c.fanoutCall(ctx, http.MethodPut, queuePath(queue, "fairness"), nil, req, &out)
	return out, err
}

// SetGroupWeight sets the weight of a group (the part of its keys before
// the first "/") in a two-level queue on every shard (weights:write, an
// operator's token). The result follows the rules of SetQueueFairness.
func (c *Client) SetGroupWeight(ctx context.Context, queue, group string, weight float64) (api.GroupWeightResult, error) {
	var out api.GroupWeightResult
	err := c.fanoutCall(ctx, http.MethodPut, queuePath(queue, "group-weights", group), nil, api.WeightBody{Weight: &weight}, &out)
	return out, err
}

// ClearGroupWeight clears a group's weight on every shard: it weighs 1
// from its next charge.
func (c *Client) ClearGroupWeight(ctx context.Context, queue, group string) (api.GroupWeightResult, error) {
	var out api.GroupWeightResult
	err := c.fanoutCall(ctx, http.MethodDelete, queuePath(queue, "group-weights", group), nil, nil, &out)
	return out, err
}
