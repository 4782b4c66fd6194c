package runstore

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/harvest-run/harvest/internal/dberr"
)

// ErrRunMoving means the run is being copied to its tenant's new home and
// cannot be changed on this shard; once the copy is done it can be on the
// new one.
var ErrRunMoving = errors.New("runstore: the run is moving to another shard")

// runMovingOrErr turns dberr.CodeRunMoving (harvest_run_cancel met a run
// a move is copying) into ErrRunMoving, wrapping err, and returns any
// other error as it is. It is the one place that code becomes a Go error.
func runMovingOrErr(err error) error {
	if dberr.Code(err) == dberr.CodeRunMoving {
		return fmt.Errorf("%w: %w", ErrRunMoving, err)
	}
	return err
}

// MovedError means the shard refused to write runs of Tenant because the
// tenant's home is now shard To (see tenant_fences in migration 0004).
type MovedError struct {
	Tenant string
	To     int
}

func (e *MovedError) Error() string {
	return fmt.Sprintf("runstore: tenant %s has moved to shard %d", e.Tenant, e.To)
}

// MovedOrErr turns the database's refusal of a fenced tenant's start into
// a *MovedError and returns any other error as it is.
func MovedOrErr(err error) error {
	if m := AsMoved(err); m != nil {
		return m
	}
	return err
}

// AsMoved returns the *MovedError err stands for (a MovedError, or the
// database's dberr.CodeTenantMoved, raised by harvest_tenant_fence with the
// new home as DETAIL and the tenant as HINT), or nil. It is the one place
// that code becomes a Go error.
func AsMoved(err error) *MovedError {
	var m *MovedError
	if errors.As(err, &m) {
		return m
	}
	pe := dberr.PgError(err)
	if pe == nil || pe.Code != dberr.CodeTenantMoved {
		return nil
	}
	to, perr := strconv.Atoi(pe.Detail)
	if perr != nil {
		return nil
	}
	return &MovedError{Tenant: pe.Hint, To: to}
}
