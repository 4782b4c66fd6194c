package runstore

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
)

// askAdmitter admits everything, asked about each new run.
type askAdmitter struct{}

func (askAdmitter) Admit(context.Context, Admission) error { return nil }

// guardAdmitter admits everything and says so in advance.
type guardAdmitter struct{ askAdmitter }

func (guardAdmitter) Guard(GuardRequest) (Guard, bool) { return Guard{Shard: 1 << 30}, true }
func (guardAdmitter) Admitted(int)                     {}

// BenchmarkCommitter measures starts through one committer from 8
// concurrent callers of one tenant with one key: the shape of
// `harvest-bench starts` without HTTP or NATS in front. "ask" decides each
// new run after the group is written (two round trips), "guard" commits
// in the round trip that writes the group.
func BenchmarkCommitter(b *testing.B) {
	for _, bc := range []struct {
		name     string
		admitter Admitter
	}{{"ask", askAdmitter{}}, {"guard", guardAdmitter{}}} {
		b.Run(bc.name, func(b *testing.B) {
			db := testsvc.NewDB(b)
			var groups, started, n atomic.Int64
			c := NewCommitter(db, 0, CommitterOptions{Admitter: bc.admitter, AfterCommit: func(cs []Committed) {
				groups.Add(1)
				started.Add(int64(len(cs)))
			}})
			b.Cleanup(c.Close)
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
		})
	}
}
