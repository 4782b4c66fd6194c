package api

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Status is where a run stands.
type Status string

// The run statuses. Completed, failed and cancelled are final.
const (
	StatusDeferred  Status = "deferred"
	StatusQueued    Status = "queued"
	StatusRunning   Status = "running"
	StatusCompleted Status = "completed"
	StatusFailed    Status = "failed"
	StatusCancelled Status = "cancelled"
)

// statuses is every run status, in the order of a run's life; the one
// list the filters, the CLI and the console check against.
var statuses = []Status{StatusDeferred, StatusQueued, StatusRunning, StatusCompleted, StatusFailed, StatusCancelled}

// Statuses returns every run status, in the order of a run's life. The
// schema's CHECK constraint on runs.status allows exactly these; a test of
// internal/schema reads the constraint from a migrated database and
// compares, so the two cannot drift apart.
func Statuses() []Status { return slices.Clone(statuses) }

// Known reports whether s is one of Statuses.
func (s Status) Known() bool { return slices.Contains(statuses, s) }

// ParseStatus reads a run status by its name, as the status filters of
// GET /v1/runs, the CLI and the console take it; the error of an unknown
// name lists the known ones.
func ParseStatus(name string) (Status, error) {
	if s := Status(name); s.Known() {
		return s, nil
	}
	names := make([]string, len(statuses))
	for i, s := range statuses {
		names[i] = string(s)
	}
	return "", fmt.Errorf("unknown status %q (known: %s)", name, strings.Join(names, ", "))
}

// Final reports whether a run in this status will never change again.
func (s Status) Final() bool {
	return s == StatusCompleted || s == StatusFailed || s == StatusCancelled
}

// Run is the run resource: the reply to a start and to GET /v1/runs/{id}.
// Times come from the database clock.
type Run struct {
	ID          string          `json:"id"`
	Tenant      string          `json:"tenant"`
	Name        string          `json:"name"`
	Queue       string          `json:"queue"`
	Shard       int             `json:"shard"`
	FairnessKey string          `json:"fairness_key"`
	QuotaKey    string          `json:"quota_key"`
	Priority    int             `json:"priority"`
	Status      Status          `json:"status"`
	Attempts    int             `json:"attempts"`
	CreatedAt   Time            `json:"created_at"`
	ClaimedAt   *Time           `json:"claimed_at"`
	FinishedAt  *Time           `json:"finished_at"`
	Output      json.RawMessage `json:"output"`
	Error       *string         `json:"error"`
	// FiresAt is set while the status is deferred: the time the deferred
	// start is due to fire, given the starts known so far (see
	// docs/deferred.md for what can move it in each mode).
	FiresAt *Time `json:"fires_at,omitempty"`
	// RunID is set on the answer for a throttled, debounced or batched
	// start: the id of the run the start fires (or fired). A throttled
	// start fires a run with its own id; the starts of one debounce window
	// or one batch all point at one run with a new id.
	RunID string `json:"run_id,omitempty"`
	// DeferMode is set with RunID: throttle, debounce or batch.
	DeferMode DeferMode `json:"defer_mode,omitempty"`
	// Waiting says why a queued or deferred run is not running yet; only
	// GET /v1/runs/{id} fills it (see RunWaiting).
	Waiting *RunWaiting `json:"waiting,omitempty"`
}
