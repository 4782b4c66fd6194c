package shard_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/pkg/shard"
)

// countRuns works on a pool or inside a caller's transaction alike.
func countRuns(ctx context.Context, db shard.Querier) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT count(*) FROM runs`).Scan(&n)
	return n, err
}

// Pass a pool, a connection or a transaction where a Querier is asked for.
func ExampleQuerier() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("SHARD_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	n, err := countRuns(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(n, "runs")
}
