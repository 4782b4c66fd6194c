package console

import (
	"context"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/pkg/api"
)

// Backend is what the pages ask of the gateway that serves them: the
// things that need its state (tokens, the admission in force, the tenant
// directory, NATS) and the actions that must go through the same path as
// the API's, so that a change made in a browser is checked, audited,
// put in force and announced exactly as one made with a token. Everything
// else the pages read straight from the shards (Options.Shards).
//
// The errors are the API's: an *api.Error carries the status the page
// answers with.
type Backend interface {
	// Authenticate returns the principal of a bearer token. A session
	// keeps its token and authenticates it on every request, so a token
	// removed from the tokens file ends its sessions at once.
	Authenticate(secret string) (auth.Principal, error)

	// Admission is the admission view of GET /v1/admission, counts read
	// fresh from every shard. When no shard answers, the error says so and
	// the view still holds the configuration in force, without counts.
	Admission(ctx context.Context) (api.AdmissionView, *api.Error)
	// PutAdmission applies a PUT /v1/admission body as actor.
	PutAdmission(ctx context.Context, actor string, body []byte) *api.Error
	// SetCeiling sets tenant's priority ceiling as actor, or clears it
	// when maxPriority is nil, and puts the change in force everywhere.
	SetCeiling(ctx context.Context, actor, tenant string, maxPriority *int) *api.Error

	// EnterRunList admits a listing of tenant's runs for a tenant's
	// session, or returns the refusal to show: the gateway bounds each
	// tenant's listings in flight, its API's and its console's together.
	// An admitted listing calls leave once it is read.
	EnterRunList(ctx context.Context, tenant string) (leave func(), e *api.Error)

	// KnownTenant reports whether the tenant directory has tenant. The
	// pages ask before they look a tenant's run up: looking up a tenant
	// the directory does not know would place it there.
	KnownTenant(ctx context.Context, tenant string) bool
	// InspectRun reads one run of tenant with its tasks, from the shard
	// that holds it now (a tenant may be moving), and returns that
	// shard. The error wraps runstore.ErrNotFound when there is no such
	// run, and is an *api.Error when the API would tell its caller why;
	// any other error is the gateway's own failure, logged there.
	InspectRun(ctx context.Context, tenant, id string) (RunDetail, int, error)
	// CancelRun cancels a run of tenant, with reason as its error.
	CancelRun(ctx context.Context, tenant, id, reason string) *api.Error
	// RetryRun puts a failed or cancelled run back in its queue as actor.
	RetryRun(ctx context.Context, actor, tenant, id string) *api.Error

	// PauseQueue pauses (paused true) or resumes queue on every shard as
	// actor.
	PauseQueue(ctx context.Context, actor, queue string, paused bool) (api.QueuePauseResult, *api.Error)
	// SetFairness changes the fairness modes of queue on every shard.
	SetFairness(ctx context.Context, actor, queue string, req api.QueueFairnessRequest) (api.QueueFairnessResult, error)
	// SetGroupWeight sets the weight of group in queue on every shard,
	// or clears it when weight is nil.
	SetGroupWeight(ctx context.Context, actor, queue, group string, weight *float64) (api.GroupWeightResult, error)

	// Audit returns the newest limit audit rows of every shard, newest
	// first, and the shards that did not answer.
	Audit(ctx context.Context, limit int) ([]AuditEntry, []int, *api.Error)
}

// AuditEntry is an audit row and the shard it lives on.
type AuditEntry struct {
	Shard int
	api.AuditEntry
}
