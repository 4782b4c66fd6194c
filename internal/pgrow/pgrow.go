package pgrow

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/pkg/shard"
)

// One runs sql on db and reads its one row into T by column name (every
// column a field, every field a column). It returns pgx.ErrNoRows when the
// statement answers no row; a second row is ignored, as QueryRow does.
func One[T any](ctx context.Context, db shard.Querier, sql string, args ...any) (T, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		var zero T
		return zero, err
	}
	return pgx.CollectOneRow(rows, pgx.RowToStructByName[T])
}

// All runs sql on db and reads every row into a T by column name.
func All[T any](ctx context.Context, db shard.Querier, sql string, args ...any) ([]T, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByName[T])
}
