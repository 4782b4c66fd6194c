package runstore

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
)

var (
	benchFlushers = 2
	benchLinger   time.Duration
)

func init() {
	if v := os.Getenv("BF"); v != "" {
		benchFlushers, _ = strconv.Atoi(v)
	}
	if v := os.Getenv("BL"); v != "" {
		benchLinger, _ = time.ParseDuration(v)
	}
}

// nopAdmitter admits everything, so the benchmark pays for the decision
// round as the gateway does.
type nopAdmitter struct{}

func (nopAdmitter) Admit(context.Context, Admission) error { return nil }

// BenchmarkCommitter measures starts through one committer from 8
// concurrent callers, one tenant and one key: the shape of
// `harvest bench starts` without HTTP or NATS in front.
func BenchmarkCommitter(b *testing.B) {
	db := testsvc.NewDB(b)
	var groups, started atomic.Int64
	c := NewCommitter(db, 0, CommitterOptions{Flushers: benchFlushers, Linger: benchLinger, Admitter: nopAdmitter{}, AfterCommit: func(cs []Committed) {
		groups.Add(1)
		started.Add(int64(len(cs)))
	}})
	b.Cleanup(c.Close)
	var n atomic.Int64
	b.SetParallelism(4) // 8 callers with GOMAXPROCS=2
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := api.StartRequest{ID: fmt.Sprint("r", n.Add(1)), Name: "echo", Queue: "shared", Input: json.RawMessage(`{"n":1}`)}
			res, err := c.Start(context.Background(), StartParams{Tenant: "bench", Req: req})
			require.NoError(b, err)
			require.True(b, res.Created)
		}
	})
	b.StopTimer()
	if g := groups.Load(); g > 0 {
		b.ReportMetric(float64(started.Load())/float64(g), "starts/group")
	}
}
