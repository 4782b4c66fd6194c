package claim

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
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

// SQLSTATE codes raised by the claim functions of the schema.
const (
	codeStaleLease = "HA001"
	codeNotFound   = "HA002"
	codeDeadlock   = "40P01"
)

// mapError is the one place where database errors become package errors.
func mapError(op string, err error) error {
	if err == nil {
		return nil
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case codeStaleLease:
			return fmt.Errorf("claim: %s: %w (%s)", op, ErrStaleLease, pe.Message)
		case codeNotFound:
			return fmt.Errorf("claim: %s: %w (%s)", op, ErrNotFound, pe.Message)
		case codeDeadlock:
			return fmt.Errorf("claim: %s: %w", op, ErrDeadlock)
		}
	}
	return fmt.Errorf("claim: %s: %w", op, err)
}
