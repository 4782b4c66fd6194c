package weights

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
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
	// ErrUnavailable: the shard could not be reached or did not answer in
	// time. Nothing is known to have changed; sending the same write again
	// is safe.
	ErrUnavailable = errors.New("weights: shard unavailable")
	// ErrNotMigrated: the shard lacks the schema this package needs (run
	// harvest migrate).
	ErrNotMigrated = errors.New("weights: shard schema is not migrated")
	// ErrRetry: the database broke a lock cycle or a serialisation
	// conflict; the statement had no effect and may be sent again.
	ErrRetry = errors.New("weights: conflict with a concurrent writer, send again")
)

// SQLSTATE codes and constraint names this package interprets.
const (
	codeCheckViolation      = "23514"
	codeUndefinedFunction   = "42883"
	codeUndefinedTable      = "42P01"
	codeDeadlock            = "40P01"
	codeSerialization       = "40001"
	codeTooManyConnections  = "53300"
	codeAdminShutdown       = "57P01"
	codeCrashShutdown       = "57P02"
	codeCannotConnectNow    = "57P03"
	codeReadOnly            = "25006" // a primary demoted under the connection
	classConnectionFailures = "08"
	constraintOverrideCap   = "weight_override_cap"
)

// mapError is the one place where database and network errors become this
// package's errors.
func mapError(op string, err error) error {
	if err == nil {
		return nil
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == codeCheckViolation && pe.ConstraintName == constraintOverrideCap:
			return fmt.Errorf("weights: %s: %w", op, ErrCapReached)
		case pe.Code == codeUndefinedFunction || pe.Code == codeUndefinedTable:
			return fmt.Errorf("weights: %s: %w (%s)", op, ErrNotMigrated, pe.Message)
		case pe.Code == codeDeadlock || pe.Code == codeSerialization:
			return fmt.Errorf("weights: %s: %w", op, ErrRetry)
		case pe.Code == codeTooManyConnections || pe.Code == codeAdminShutdown ||
			pe.Code == codeCrashShutdown || pe.Code == codeCannotConnectNow || pe.Code == codeReadOnly ||
			strings.HasPrefix(pe.Code, classConnectionFailures):
			return fmt.Errorf("weights: %s: %w: %s", op, ErrUnavailable, pe.Message)
		}
		return fmt.Errorf("weights: %s: %w", op, err)
	}
	if unreachable(err) {
		return fmt.Errorf("weights: %s: %w: %v", op, ErrUnavailable, err)
	}
	return fmt.Errorf("weights: %s: %w", op, err)
}

// unreachable reports whether err means that the shard did not answer, as
// opposed to answering with an error.
func unreachable(err error) bool {
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) ||
		errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, context.Canceled) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) ||
		pgconn.Timeout(err) ||
		errors.As(err, &ne)
}
