package main

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// pgxTx is the transaction type of River's pgx v5 driver.
type pgxTx = pgx.Tx

// pgxPool is the part of *pgxpool.Pool the drain loop needs.
type pgxPool interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
