package claim

import (
	"errors"
	"fmt"

	"github.com/harvest-run/harvest/internal/dberr"
)

// Sentinel errors. Wrapped errors keep the database message.
var (
	// ErrStaleLease: the lease token is not the task's current one (the
	// lease expired and the task was rescued or claimed again, or the task
	// is no longer running). Nothing was changed.
	ErrStaleLease = errors.New("claim: stale lease token")
	// ErrNotFound: no task has that id.
	ErrNotFound = errors.New("claim: task not found")
	// ErrDeadlock: the database broke a lock cycle; the statement had no
	// effect and may be sent again.
	ErrDeadlock = errors.New("claim: deadlock detected")
)

// mapError is the one place where database errors become package errors,
// and the one place in the module where the claim functions' own codes
// (dberr.CodeStaleLease, dberr.CodeTaskNotFound) become Go errors.
func mapError(op string, err error) error {
	if err == nil {
		return nil
	}
	if pe := dberr.PgError(err); pe != nil {
		switch pe.Code {
		case dberr.CodeStaleLease:
			return fmt.Errorf("claim: %s: %w (%s)", op, ErrStaleLease, pe.Message)
		case dberr.CodeTaskNotFound:
			return fmt.Errorf("claim: %s: %w (%s)", op, ErrNotFound, pe.Message)
		case dberr.CodeDeadlock:
			return fmt.Errorf("claim: %s: %w", op, ErrDeadlock)
		}
	}
	return fmt.Errorf("claim: %s: %w", op, err)
}
