package gateway

import (
	"context"
	"errors"

	"github.com/harvest-run/harvest/internal/dberr"
	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/pkg/api"
)

// reservedIDConstraint is the constraint named by the refusal of a run
// whose id a deferred start holds (migration 0005_deferred_ids).
const reservedIDConstraint = "runs_id_reserved_by_deferred_start"

// apiError turns an error into the API error the caller gets, for every
// route: the start, read, list, cancel and retry paths (internal/runstore),
// and the weights, quotas, fairness, admission and priority routes
// (pkg/weights, pkg/tenantcap), whose refusals are already *api.Error
// values (400 naming the field). shard names the shard in a 503 (0 for the
// routes that write every shard or shard 0). Errors with no meaning for the
// caller are logged and answered with a bare 500.
func (g *Gateway) apiError(err error, shard int, what string) *api.Error {
	var ae *api.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, runstore.ErrConflict):
		return api.NewError(api.CodeConflict, "a run with this id exists with a different request; use a new id, or send the same request again")
	case errors.Is(err, runstore.ErrNotFound):
		return api.NewError(api.CodeNotFound, "no such run")
	case errors.Is(err, runstore.ErrFinished):
		return api.NewError(api.CodeConflict, "the run has already finished")
	case errors.Is(err, runstore.ErrBadCursor):
		return api.Invalid("cursor", "cursor is not one this API returned")
	case errors.Is(err, runstore.ErrClosed):
		return api.NewError(api.CodeUnavailable, "the gateway is shutting down; try again")
	case errors.Is(err, context.Canceled):
		return api.NewError(api.CodeUnavailable, "the request was cancelled before it finished")
	case dberr.Unavailable(err):
		g.log.Warn("gateway: shard unavailable", "shard", shard, "op", what, "err", err)
		return api.NewError(api.CodeUnavailable, "shard %d is unavailable; try again later", shard)
	}
	pe := dberr.PgError(err)
	switch {
	case pe == nil:
	case pe.Code == dberr.CodeUniqueViolation && pe.ConstraintName == reservedIDConstraint:
		// An ordinary start reusing the id of a debounce or batch start
		// (migration 0005).
		return api.NewError(api.CodeConflict, "this id was used by a debounced or batched start; use a new id, or send the same request again")
	case pe.Code == dberr.CodeUntranslatableCharacter:
		return api.Invalid("input", "input holds a character the database cannot store (\\u0000)")
	case dberr.InClass(pe.Code, dberr.ClassDataException):
		// A data exception: a value the database cannot hold.
		return api.NewError(api.CodeInvalidArgument, "a value of the request cannot be stored: %s", pe.Message)
	}
	g.log.Error("gateway: internal error", "shard", shard, "op", what, "err", err)
	return api.NewError(api.CodeInternal, "internal error (%s)", what)
}
