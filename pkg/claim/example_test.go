package claim_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/pkg/claim"
)

// Claim the next task of a queue in weighted fair order of its fairness
// keys, then complete it under its lease. A Claimer combines the claims of
// one process's loops into fewer statements.
func ExampleClaimer_Claim() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("SHARD_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	c := claim.NewClaimer(pool)
	res, err := c.Claim(ctx, claim.Request{Queue: "images", Worker: "example-1", Fair: true})
	if err != nil {
		log.Fatal(err)
	}
	if !res.OK {
		fmt.Println("nothing to claim")
		return
	}
	fmt.Println("claimed task", res.Task.ID, "of key", res.Task.Key)
}
