package migrate_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/pkg/migrate"
)

// Migrate each shard at the start of a service that embeds Harvest, then
// print what each has applied.
func Example() {
	ctx := context.Background()
	for _, url := range []string{os.Getenv("SHARD_0_URL"), os.Getenv("SHARD_1_URL")} {
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			log.Fatal(err)
		}
		if err := migrate.Up(ctx, pool); err != nil {
			log.Fatal(err)
		}
		ms, err := migrate.Status(ctx, pool)
		if err != nil {
			log.Fatal(err)
		}
		for _, m := range ms {
			fmt.Println(m.Version, m.Name, m.Applied)
		}
		pool.Close()
	}
}
