package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Bounds of ClaimShares' arguments: the window stays a read of recent
// index entries and the chart a bounded number of series and points.
const (
	minShareBucket  = time.Second
	maxShareBucket  = 24 * time.Hour
	maxShareBuckets = 360
	maxShareKeys    = 50
)

// shareRow is what KeyClaimShares reads; the row with no key carries only
// the shard's clock.
type shareRow struct {
	EndAt  time.Time `db:"end_at"`
	Key    *string   `db:"key"`
	Bucket *int      `db:"bucket"`
	Claims int       `db:"claims"`
}

// ClaimShares reads the claims of queue's keys in buckets of bucket
// over the last buckets*bucket (from the tasks_claimed_at index). The
// maxKeys keys with the most claims are listed by name; the others are
// summed under OtherKey. With owner set only the keys bound to that tenant
// are counted.
//
// Each shard buckets its claims on its own clock and the buckets of the
// shards are added up; End is the latest clock of the shards that
// answered. Keys lists the kept keys with the most claims first (ties by
// name), then OtherKey when any other key had claims. A task counts once,
// at its latest claim.
func ClaimShares(ctx context.Context, shards []*pgxpool.Pool, queue string, bucket time.Duration, buckets, maxKeys int, owner string) (Shares, error) {
	switch {
	case queue == "":
		return Shares{}, errors.New("console: queue is empty")
	case bucket < minShareBucket || bucket > maxShareBucket:
		return Shares{}, fmt.Errorf("console: bucket %s out of %s..%s", bucket, minShareBucket, maxShareBucket)
	case buckets < 1 || buckets > maxShareBuckets:
		return Shares{}, fmt.Errorf("console: buckets %d out of 1..%d", buckets, maxShareBuckets)
	case maxKeys < 1 || maxKeys > maxShareKeys:
		return Shares{}, fmt.Errorf("console: maxKeys %d out of 1..%d", maxKeys, maxShareKeys)
	}
	ok, down, err := fanOut(ctx, shards, func(ctx context.Context, _ int, db *pgxpool.Pool) ([]shareRow, error) {
		rows, err := db.Query(ctx, sqlKeyClaimShares, queue, bucket.Microseconds(), buckets, owner)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowToStructByName[shareRow])
	})
	if err != nil {
		return Shares{}, fmt.Errorf("console: claim shares: %w", err)
	}

	out := Shares{Bucket: bucket, Total: make([]int, buckets), UnavailableShards: down}
	perKey := map[string][]int{}
	total := map[string]int{}
	for _, a := range ok {
		for _, r := range a.Value {
			if r.EndAt.After(out.End) {
				out.End = r.EndAt
			}
			if r.Key == nil || r.Bucket == nil || *r.Bucket < 0 || *r.Bucket >= buckets {
				continue
			}
			c := perKey[*r.Key]
			if c == nil {
				c = make([]int, buckets)
				perKey[*r.Key] = c
			}
			c[*r.Bucket] += r.Claims
			total[*r.Key] += r.Claims
			out.Total[*r.Bucket] += r.Claims
		}
	}

	keys := make([]string, 0, len(perKey))
	for k := range perKey {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		return cmp.Or(cmp.Compare(total[b], total[a]), cmp.Compare(a, b))
	})
	out.Keys, out.Counts = []string{}, [][]int{}
	for i, k := range keys {
		if i < maxKeys {
			out.Keys = append(out.Keys, k)
			out.Counts = append(out.Counts, perKey[k])
			continue
		}
		if i == maxKeys {
			out.Keys = append(out.Keys, OtherKey)
			out.Counts = append(out.Counts, make([]int, buckets))
		}
		other := out.Counts[len(out.Counts)-1]
		for b, n := range perKey[k] {
			other[b] += n
		}
	}
	return out, nil
}
