package runstore

import (
	"context"
	"fmt"

	"github.com/harvest-run/harvest/internal/sqlfile"
	"github.com/harvest-run/harvest/pkg/shard"
)

var sqlRunNotify = sqlfile.Must(sqlFiles, "RunNotify")

// Notify makes the tenant's run id announce its end on NATS
// (harvest.runs.<tenant>.<run_id>) when it did not ask for that at its
// start: a long poll on the run calls it before its first read, so that
// the event it listens for will be sent. It reports whether the run was
// changed; a run that is final, asks already, or does not exist is left
// alone (false, nil).
func Notify(ctx context.Context, db shard.Querier, tenant, id string) (bool, error) {
	tag, err := db.Exec(ctx, sqlRunNotify, tenant, id)
	if err != nil {
		return false, fmt.Errorf("runstore: ask for the run's event: %w", err)
	}
	return tag.RowsAffected() > 0, nil
}
