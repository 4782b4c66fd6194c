package migrate

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/internal/schema"
)

// ErrPreBaseline is returned by Up for a shard made by a development build
// from before the schema baseline: recreate its database.
var ErrPreBaseline = schema.ErrPreBaseline

// Up migrates the shard behind pool to this release's schema and returns
// nil once it is there. A shard that a newer release migrated is left
// alone (its schema is a superset of this one's).
func Up(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := schema.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// Migration is one numbered migration of the schema and whether a shard
// has it.
type Migration struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
	// Applied says whether the shard has it; AppliedAt is when (the
	// database's clock), zero when pending.
	Applied   bool      `json:"applied"`
	AppliedAt time.Time `json:"applied_at"`
}

// Latest is the version of the newest migration of this release.
func Latest() int { return schema.Latest() }

// Status lists this release's migrations in order, each marked applied or
// pending on the shard behind pool. A shard never migrated has them all
// pending.
func Status(ctx context.Context, pool *pgxpool.Pool) ([]Migration, error) {
	ms, err := schema.Migrations()
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	type applied struct {
		Version   int32
		AppliedAt time.Time
	}
	var migrated bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('schema_migrations') IS NOT NULL`).Scan(&migrated); err != nil {
		return nil, fmt.Errorf("migrate: look for the migrations table: %w", err)
	}
	var done []applied
	if migrated {
		rows, err := pool.Query(ctx, `SELECT version, applied_at FROM schema_migrations`)
		if err == nil {
			done, err = pgx.CollectRows(rows, pgx.RowToStructByName[applied])
		}
		if err != nil {
			return nil, fmt.Errorf("migrate: read applied migrations: %w", err)
		}
	}
	at := map[int]time.Time{}
	for _, d := range done {
		at[int(d.Version)] = d.AppliedAt
	}
	out := make([]Migration, len(ms))
	for i, m := range ms {
		t, ok := at[m.Version]
		out[i] = Migration{Version: m.Version, Name: m.Name, Applied: ok, AppliedAt: t}
	}
	return out, nil
}
