package runstore

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"
)

// SQLSTATE codes a move of a tenant raises (class HA is Harvest's own).
const (
	// codeTenantMoved: a start of a tenant whose home the shard no longer
	// is (harvest_tenant_fence). DETAIL holds the new home, HINT the tenant.
	codeTenantMoved = "HA020"
)

// ErrRunMoving means the run is being copied to its tenant's new home and
// cannot be changed on this shard; once the copy is done it can be on the
// new one.
var ErrRunMoving = errors.New("runstore: the run is moving to another shard")

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
// database's HA020), or nil.
func AsMoved(err error) *MovedError {
	var m *MovedError
	if errors.As(err, &m) {
		return m
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != codeTenantMoved {
		return nil
	}
	to, perr := strconv.Atoi(pe.Detail)
	if perr != nil {
		return nil
	}
	return &MovedError{Tenant: pe.Hint, To: to}
}
