package api

import (
	"fmt"
	"net/http"
)

// Code is the machine-readable kind of an error; each code has one HTTP status.
type Code string

// The error codes of the API.
const (
	CodeInvalidArgument  Code = "invalid_argument"
	CodeUnauthenticated  Code = "unauthenticated"
	CodePermissionDenied Code = "permission_denied"
	CodeNotFound         Code = "not_found"
	CodeConflict         Code = "conflict"
	CodePayloadTooLarge  Code = "payload_too_large"
	CodeOverLimit        Code = "over_limit"
	CodeUnavailable      Code = "unavailable"
	CodeInternal         Code = "internal"
)

// Status returns the HTTP status that goes with the code. The same number is
// used over NATS so callers handle both transports alike.
func (c Code) Status() int {
	switch c {
	case CodeInvalidArgument:
		return http.StatusBadRequest
	case CodeUnauthenticated:
		return http.StatusUnauthorized
	case CodePermissionDenied:
		return http.StatusForbidden
	case CodeNotFound:
		return http.StatusNotFound
	case CodeConflict:
		return http.StatusConflict
	case CodePayloadTooLarge:
		return http.StatusRequestEntityTooLarge
	case CodeOverLimit:
		return http.StatusTooManyRequests
	case CodeUnavailable:
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// Error is the body of every failed call: {"error": {...}} on the wire.
type Error struct {
	Status       int    `json:"status"`
	Code         Code   `json:"code"`
	Message      string `json:"message"`
	Field        string `json:"field,omitempty"`
	RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
}

// Error formats the error for logs and Go callers.
func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s (%d): %s: %s", e.Code, e.Status, e.Field, e.Message)
	}
	return fmt.Sprintf("%s (%d): %s", e.Code, e.Status, e.Message)
}

// RetryAfterSeconds is RetryAfterMS in whole seconds, rounded up, as the
// Retry-After header carries it: a wait shorter than a second is sent as
// one, never as zero (which would ask for a retry at once). Zero when the
// error asks for no wait.
func (e *Error) RetryAfterSeconds() int64 {
	if e.RetryAfterMS <= 0 {
		return 0
	}
	return (e.RetryAfterMS + 999) / 1000
}

// ErrorBody is the JSON envelope of an Error.
type ErrorBody struct {
	Error *Error `json:"error"`
}

// NewError makes an error of the given code with its matching status.
func NewError(code Code, format string, args ...any) *Error {
	return &Error{Status: code.Status(), Code: code, Message: fmt.Sprintf(format, args...)}
}

// Invalid makes a 400 error that names the field at fault.
func Invalid(field, format string, args ...any) *Error {
	e := NewError(CodeInvalidArgument, format, args...)
	e.Field = field
	return e
}
