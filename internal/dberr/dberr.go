package dberr

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// SQLSTATE codes of PostgreSQL that Harvest interprets.
const (
	// CodeSerialization (serialization_failure): the transaction lost a
	// serialization conflict and was rolled back.
	CodeSerialization = "40001"
	// CodeDeadlock (deadlock_detected): the transaction was chosen to end a
	// lock cycle and was rolled back.
	CodeDeadlock = "40P01"
	// CodeReadOnly (read_only_sql_transaction): a write reached a server
	// that accepts only reads, such as a primary demoted to a standby, or
	// one fenced with default_transaction_read_only during a switchover.
	CodeReadOnly = "25006"
	// CodeQueryCanceled (query_canceled): a statement timeout or a cancel
	// request; the caller's own doing, not the shard's state.
	CodeQueryCanceled = "57014"
	// CodeAdminShutdown, CodeCrashShutdown, CodeCannotConnectNow: the
	// server is stopping (or the backend was terminated), crashed, or does
	// not accept sessions yet.
	CodeAdminShutdown    = "57P01"
	CodeCrashShutdown    = "57P02"
	CodeCannotConnectNow = "57P03"
	// CodeTooManyConnections (too_many_connections): max_connections is
	// reached.
	CodeTooManyConnections = "53300"
	// CodeUniqueViolation and CodeCheckViolation: a row broke a unique or
	// a check constraint (the constraint's name tells which).
	CodeUniqueViolation = "23505"
	CodeCheckViolation  = "23514"
	// CodeUntranslatableCharacter: text holds \u0000, which PostgreSQL
	// cannot store.
	CodeUntranslatableCharacter = "22P05"
	// CodeUndefinedFunction and CodeUndefinedTable: the shard's schema is
	// older than the code (not migrated).
	CodeUndefinedFunction = "42883"
	CodeUndefinedTable    = "42P01"
	// CodeFeatureNotSupported (feature_not_supported): for instance a
	// server built without ICU asked for an ICU collation.
	CodeFeatureNotSupported = "0A000"
)

// SQLSTATE classes (the code's first two characters) Harvest interprets.
const (
	ClassConnectionException   = "08"
	ClassDataException         = "22"
	ClassInsufficientResources = "53"
	ClassOperatorIntervention  = "57"
)

// Harvest's own codes (class HA), raised by its SQL functions; the package
// doc says which package maps each.
const (
	// CodeStaleLease: the lease token is not the task's current one.
	CodeStaleLease = "HA001"
	// CodeTaskNotFound: no task has that id.
	CodeTaskNotFound = "HA002"
	// CodeTenantMoved: a write of a tenant whose home the shard no longer
	// is; DETAIL holds the new home, HINT the tenant.
	CodeTenantMoved = "HA020"
	// CodeRunMoving: a cancel met a run that a tenant move is copying
	// (move_out); the statement was undone.
	CodeRunMoving = "HA021"
)

// PgError returns the server's error in err's chain, or nil when the
// server did not answer with an error.
func PgError(err error) *pgconn.PgError {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe
	}
	return nil
}

// Code returns the SQLSTATE of the server's error in err's chain, or ""
// when there is none.
func Code(err error) string {
	if pe := PgError(err); pe != nil {
		return pe.Code
	}
	return ""
}

// InClass reports whether code belongs to class (its first two
// characters).
func InClass(code, class string) bool {
	return len(code) == 5 && code[:2] == class
}

// Conflict reports a transaction the database rolled back to end a lock
// cycle or a serialization conflict: sending it again in a new transaction
// is safe and likely to succeed. The request paths (internal/runstore)
// retry on it alone; see Retryable for why 25006 is not among them.
func Conflict(err error) bool {
	switch Code(err) {
	case CodeDeadlock, CodeSerialization:
		return true
	}
	return false
}

// Retryable reports an error after which the same work sent again in a new
// transaction is safe and may succeed: a Conflict, or a write refused
// whole by a server that stopped being the primary (25006; internal/pgpool
// closed that connection and retired the pool's others, so the next
// attempt connects afresh and reaches the new primary, or fails to connect
// and is not retried). Background work with no caller to answer retries
// on it (internal/tenantmove, internal/deferred); a request path answers
// 25006 with 503 and Retry-After instead (Unavailable), so that a
// switchover costs a client's retry rather than holding the request, and
// its batch, while the shard changes primary.
func Retryable(err error) bool {
	return Conflict(err) || Code(err) == CodeReadOnly
}

// Unavailable reports whether err means that the shard could not be
// reached, did not answer in time, or answered that it cannot serve now,
// as opposed to refusing the statement. Nothing is known to have been
// written (a transaction that failed so was rolled back), and the same
// request sent later may succeed. Case by case:
//
//   - 25006: the statement reached a server that is no longer the primary
//     (a switchover); the next connection goes to the new one.
//   - class 08 (connection exception), 53 (insufficient resources: too
//     many connections, out of memory or disk), 57 (operator
//     intervention: shutdown, crash, not accepting sessions yet, a
//     terminated backend), except 57014 (query_canceled: a statement
//     timeout or the caller's own cancel).
//   - no answer from the server at all: a failed connect
//     (*pgconn.ConnectError, unless the server refused it with a code of
//     its own, which the cases above judge), a network error, a timeout or
//     cancellation inside pgx, an error pgx raised before anything was
//     sent (pgconn.SafeToRetry: a pooled connection found closed), the
//     context's deadline or cancellation, a connection closed under the
//     statement (EOF, reset, broken pipe, closed).
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	if pe := PgError(err); pe != nil {
		return unavailableCode(pe.Code)
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) || pgconn.Timeout(err) || pgconn.SafeToRetry(err) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func unavailableCode(code string) bool {
	switch {
	case code == CodeReadOnly:
		return true
	case code == CodeQueryCanceled:
		return false
	}
	return InClass(code, ClassConnectionException) || InClass(code, ClassInsufficientResources) ||
		InClass(code, ClassOperatorIntervention)
}

// Unreachable reports that nothing answered at the address: no server
// listens there (refused, no such socket, no route, reset), or none
// answered in time. A server that answered with an error (a wrong
// password, no such database, starting up) is not unreachable, and
// neither is a host name that does not resolve: both are mistakes to
// report, not a missing server. The test harness and harvest dev start a
// throwaway server only for this; Unavailable is the wider question a
// request asks.
func Unreachable(err error) bool {
	if err == nil || PgError(err) != nil {
		return false
	}
	for _, errno := range []syscall.Errno{
		syscall.ECONNREFUSED, syscall.ENOENT, syscall.EHOSTUNREACH,
		syscall.ENETUNREACH, syscall.EADDRNOTAVAIL, syscall.ECONNRESET,
	} {
		if errors.Is(err, errno) {
			return true
		}
	}
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// PrimaryLost reports whether code is an SQLSTATE after which a
// connection's server can no longer be taken for the shard's writable
// primary: read-only (25006), shutting down or crashed (57P01, 57P02),
// not accepting sessions (57P03). internal/pgpool closes the connection
// and retires the pool's older ones on it. Every such code is also
// Unavailable.
func PrimaryLost(code string) bool {
	switch code {
	case CodeReadOnly, CodeAdminShutdown, CodeCrashShutdown, CodeCannotConnectNow:
		return true
	}
	return false
}
