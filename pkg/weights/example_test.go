package weights_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/pkg/weights"
)

// Give a fairness key twice the default share of a queue on every shard.
// A shard that cannot be reached is reported in the result (HTTP 207 at
// the gateway); the others keep the change.
func ExampleSet() {
	ctx := context.Background()
	var shards []weights.Shard
	for i, url := range []string{os.Getenv("SHARD_0_URL"), os.Getenv("SHARD_1_URL")} {
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			log.Fatal(err)
		}
		defer pool.Close()
		shards = append(shards, weights.Shard{Index: i, DB: pool})
	}
	res, err := weights.Set(ctx, shards, "ops@example.com", "images", "customer-42", 2)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Status())
}
