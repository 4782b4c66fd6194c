package shard

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier runs statements on a shard.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Beginner is a Querier that can also open a transaction (a savepoint,
// inside a pgx.Tx).
type Beginner interface {
	Querier
	Begin(ctx context.Context) (pgx.Tx, error)
}

// The pgx types Harvest is used with satisfy both.
var (
	_ Beginner = (*pgx.Conn)(nil)
	_ Beginner = pgx.Tx(nil)
)
