package runstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/harvest-run/harvest/internal/pgrow"
	"github.com/harvest-run/harvest/internal/sqlfile"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/shard"
)

var sqlRunGetMany = sqlfile.Must(sqlFiles, "RunGetMany")

// GetMany reads several runs of one shard in one query: run i is
// (tenants[i], ids[i]). Runs come back in creation order; pairs with no run
// are left out. A worker that finished a batch of tasks uses it to announce
// their runs.
func GetMany(ctx context.Context, db shard.Querier, tenants, ids []string, shard int) ([]api.Run, error) {
	if len(tenants) != len(ids) {
		return nil, errors.New("runstore: GetMany: tenants and ids differ in length")
	}
	if len(ids) == 0 {
		return nil, nil
	}
	got, err := pgrow.All[RunRow](ctx, db, sqlRunGetMany, tenants, ids)
	if err != nil {
		return nil, fmt.Errorf("runstore: read runs: %w", err)
	}
	out := make([]api.Run, len(got))
	for i, r := range got {
		out[i] = r.Run(shard)
	}
	return out, nil
}
