package client

import (
	"errors"
	"net/http"
	"time"

	"github.com/harvest-run/harvest/pkg/api"
)

// The sentinel errors below let callers branch on the kind of refusal with
// errors.Is, over HTTP and NATS alike, without reading codes:
//
//	if errors.Is(err, client.ErrOverLimit) { ... }
//
// Every refusal the client returns is an *Error, which wraps the
// gateway's *api.Error, so errors.As with either type still works.
var (
	// ErrOverLimit: the gateway refused for admission or a quota (429);
	// the error's RetryAfter says when to come back.
	ErrOverLimit = errors.New("client: over limit")
	// ErrNotFound: no such run or resource (404).
	ErrNotFound = errors.New("client: not found")
	// ErrUnavailable: the gateway or the shard behind it cannot serve the
	// call now (503), or no gateway answers on NATS.
	ErrUnavailable = errors.New("client: unavailable")
	// ErrUnauthorized: the token is missing or unknown (401).
	ErrUnauthorized = errors.New("client: unauthorized")
	// ErrForbidden: the token lacks the privilege the call needs (403).
	ErrForbidden = errors.New("client: forbidden")
	// ErrConflict: the id was used with a different request, or the run
	// is already final (409).
	ErrConflict = errors.New("client: conflict")
	// ErrInvalid: the request itself is wrong (400 or 422); sending it
	// again will not help.
	ErrInvalid = errors.New("client: invalid request")
)

// Error is a refusal by the gateway: its *api.Error (code, status,
// message, field) plus what the transport said about retrying.
type Error struct {
	// API is the error the gateway answered (or the client made up from
	// the status when the body held none).
	API *api.Error
	// retryAfter is the Retry-After header's wait, zero when absent.
	retryAfter time.Duration
}

// Error formats the gateway's error.
func (e *Error) Error() string { return e.API.Error() }

// Unwrap returns the *api.Error, so errors.As(err, &apiErr) keeps working
// for callers written before Error existed.
func (e *Error) Unwrap() error { return e.API }

// Is reports whether the error is of the kind target names (one of the
// sentinels above). The code decides; the HTTP status stands in for an
// error without a known code.
func (e *Error) Is(target error) bool {
	code, status := e.API.Code, e.API.Status
	switch target {
	case ErrOverLimit:
		return code == api.CodeOverLimit || (code == "" && status == http.StatusTooManyRequests)
	case ErrNotFound:
		return code == api.CodeNotFound || (code == "" && status == http.StatusNotFound)
	case ErrUnavailable:
		return code == api.CodeUnavailable || (code == "" && status == http.StatusServiceUnavailable)
	case ErrUnauthorized:
		return code == api.CodeUnauthenticated || (code == "" && status == http.StatusUnauthorized)
	case ErrForbidden:
		return code == api.CodePermissionDenied || (code == "" && status == http.StatusForbidden)
	case ErrConflict:
		return code == api.CodeConflict || (code == "" && status == http.StatusConflict)
	case ErrInvalid:
		return code == api.CodeInvalidArgument || status == http.StatusBadRequest ||
			status == http.StatusUnprocessableEntity
	}
	return false
}

// RetryAfter is how long the gateway asked the caller to wait before
// trying again: the Retry-After header over HTTP, else the error's
// retry_after_ms (which NATS answers carry); zero when it said nothing.
func (e *Error) RetryAfter() time.Duration {
	if e.retryAfter > 0 {
		return e.retryAfter
	}
	return time.Duration(e.API.RetryAfterMS) * time.Millisecond
}
