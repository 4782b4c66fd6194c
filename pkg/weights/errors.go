package weights

import (
	"errors"
	"fmt"

	"github.com/harvest-run/harvest/internal/dberr"
)

// Sentinel errors of the one-shard functions. Wrapped errors keep the
// database's message; match them with errors.Is. Invalid arguments are
// reported as *api.Error values (status 400, naming the field) instead.
var (
	// ErrCapReached: the shard refused a new override because the queue
	// already holds MaxOverrides of them. The refusal's audit row was
	// written by the same statement; on a pool it is committed, inside a
	// transaction of yours it is kept only if you commit.
	ErrCapReached = errors.New("weights: override cap reached")
	// ErrUnavailable: the shard could not be reached, did not answer in
	// time, or answered that it cannot serve now (shutting down, read-only
	// after a switchover, out of connections or other resources): what
	// internal/dberr calls Unavailable, and the gateway answers 503 for.
	// Nothing is known to have changed; sending the same write again is
	// safe.
	ErrUnavailable = errors.New("weights: shard unavailable")
	// ErrNotMigrated: the shard lacks the schema this package needs (run
	// harvest migrate).
	ErrNotMigrated = errors.New("weights: shard schema is not migrated")
	// ErrRetry: the database broke a lock cycle or a serialisation
	// conflict; the statement had no effect and may be sent again.
	ErrRetry = errors.New("weights: conflict with a concurrent writer, send again")
)

// constraintOverrideCap is the check that refuses an override past
// MaxOverrides (its SQLSTATE is dberr.CodeCheckViolation).
const constraintOverrideCap = "weight_override_cap"

// mapError is the one place where database and network errors become this
// package's errors. The codes and classes are internal/dberr's, so that a
// shard is unavailable here exactly when the gateway answers 503 for it.
func mapError(op string, err error) error {
	if err == nil {
		return nil
	}
	if pe := dberr.PgError(err); pe != nil {
		switch {
		case pe.Code == dberr.CodeCheckViolation && pe.ConstraintName == constraintOverrideCap:
			return fmt.Errorf("weights: %s: %w", op, ErrCapReached)
		case pe.Code == dberr.CodeUndefinedFunction || pe.Code == dberr.CodeUndefinedTable:
			return fmt.Errorf("weights: %s: %w (%s)", op, ErrNotMigrated, pe.Message)
		case dberr.Conflict(err):
			return fmt.Errorf("weights: %s: %w", op, ErrRetry)
		case dberr.Unavailable(err):
			return fmt.Errorf("weights: %s: %w: %s", op, ErrUnavailable, pe.Message)
		}
		return fmt.Errorf("weights: %s: %w", op, err)
	}
	if dberr.Unavailable(err) {
		return fmt.Errorf("weights: %s: %w: %v", op, ErrUnavailable, err)
	}
	return fmt.Errorf("weights: %s: %w", op, err)
}
