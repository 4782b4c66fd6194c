package weights

import (
	"context"
	"time"

	"github.com/harvest-run/harvest/internal/auditdoc"
	"github.com/harvest-run/harvest/pkg/shard"
)

// RefusedChange is a change that was refused, for the audit log.
type RefusedChange struct {
	Actor  string
	Action string // "weight.set", "quota.clear", "admission.set", ...
	// Queue and Key are empty when the change names none.
	Queue, Key string
	// Old is the setting in force when the change was refused (a JSON
	// document, or nil).
	Old []byte
	// Attempted is what the caller sent (a JSON document, or nil).
	Attempted []byte
	Message   string
	// Status is the HTTP status the caller was answered with (403, 400,
	// 413, 429...); 0 when the writer has none. It is part of what makes
	// two refusals the same (see AuditRefused).
	Status int
}

// DefaultRefusalFold is the window within which the refusals of one
// actor at one action with one status share one audit row (counted in its
// repeats). harvest_weight_set uses the same window for its refusals at
// the override cap.
const DefaultRefusalFold = time.Minute

// AuditRefused writes the audit row of a refused change on the shard of
// db: the one writer of refused rows, so that no caller, privileged or
// not, can flood the log or make its rows large.
//
// Refusals fold. Two refusals are the same when they have the same actor,
// action and status; the queue, key, message and body are not compared,
// since a caller chooses them and could vary them at will. A refusal the
// same as the latest refused row younger than fold (DefaultRefusalFold
// when fold is zero or less) raises that row's repeats and sets its last
// time instead of adding a row, so an actor leaves at most one row per
// action, status and window; the row keeps what the first refusal of its
// window sent.
//
// What is stored is bounded whatever the caller sent: the actor, queue,
// key and message at auditdoc.MaxTextBytes each, the old and attempted
// documents at auditdoc.MaxBytes each, cut with auditdoc.Marker and made
// storable (valid UTF-8, no NUL), so a refusal cannot escape the log by
// failing to insert either.
func AuditRefused(ctx context.Context, db shard.Querier, r RefusedChange, fold time.Duration) error {
	if fold <= 0 {
		fold = DefaultRefusalFold
	}
	var queue, key any
	if r.Queue != "" {
		queue = auditdoc.Text(r.Queue, auditdoc.MaxTextBytes)
	}
	if r.Key != "" {
		key = auditdoc.Text(r.Key, auditdoc.MaxTextBytes)
	}
	var id int64
	err := db.QueryRow(ctx, sqlAuditRefused, auditdoc.Text(r.Actor, auditdoc.MaxTextBytes), r.Action, queue, key,
		auditdoc.Value(r.Old), auditdoc.Value(r.Attempted), auditdoc.Text(r.Message, auditdoc.MaxTextBytes),
		fold.String(), r.Status).Scan(&id)
	return mapError("audit refusal", err)
}
