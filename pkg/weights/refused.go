package weights

import (
	"context"
	"time"

	"github.com/harvest-run/harvest/internal/auditdoc"
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
}

// DefaultRefusalFold is the window within which an actor's refused
// attempts at one action, by a token without the privilege, share one
// audit row (counted in its repeats).
const DefaultRefusalFold = time.Minute

// AuditRefused writes the audit row of a refused change on the shard of
// db. With fold above zero, a refusal of the same actor and action within
// fold of the last one raises that row's repeats instead of adding a row:
// what a gateway does for tokens that lack the privilege, so that no
// token can flood the log. With fold 0 every refusal gets its own row.
func AuditRefused(ctx context.Context, db DB, r RefusedChange, fold time.Duration) error {
	var queue, key any
	if r.Queue != "" {
		queue = r.Queue
	}
	if r.Key != "" {
		key = r.Key
	}
	var id int64
	err := db.QueryRow(ctx, sqlAuditRefused, r.Actor, r.Action, queue, key, auditdoc.Value(r.Old), auditdoc.Value(r.Attempted),
		r.Message, fold.String()).Scan(&id)
	return mapError("audit refusal", err)
}
