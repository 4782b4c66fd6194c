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
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// askAdmitter admits everything, asked about each new run.
type askAdmitter struct{}

func (askAdmitter) Admit(context.Context, tenantcap.Admission) error { return nil }

// ruleAdmitter admits everything by a rule the statement applies.
type ruleAdmitter struct{ askAdmitter }

func (ruleAdmitter) Rule(int) (tenantcap.Rule, error) {
	return tenantcap.Rule{Config: tenantcap.DefaultConfig(), MaxRuns: 1 << 30}, nil
}
func (ruleAdmitter) Acquire(context.Context, int, int, int) (int, error) { return 0, nil }
func (ruleAdmitter) Decided(int, []tenantcap.Decision)                   {}

// BenchmarkCommitter measures starts through one committer: 8 concurrent
// callers of one tenant with one key (the shape of `harvest-bench starts`
// without HTTP or NATS in front), and 64 callers spread over 8 tenants.
// "ask" asks a Go hook about each new run after the group is written (two
// round trips more), "rule" has the statement decide (one round trip).
func BenchmarkCommitter(b *testing.B) {
	for _, bc := range []struct {
		name     string
		admitter tenantcap.Hook
	}{{"ask", askAdmitter{}}, {"rule", ruleAdmitter{}}} {
		for _, shape := range []struct {
			tenants, callersPerProc int
		}{{1, 4}, {8, 32}} {
			name := bc.name
			if shape.tenants > 1 {
				name += fmt.Sprintf("/tenants=%d", shape.tenants)
			}
			b.Run(name, func(b *testing.B) {
				db := testsvc.NewDB(b)
				var groups, started, n atomic.Int64
				c := NewCommitter(db, 0, CommitterOptions{Admitter: bc.admitter, AfterCommit: func(cs []Committed) {
					groups.Add(1)
					started.Add(int64(len(cs)))
				}})
				b.Cleanup(c.Close)
				b.SetParallelism(shape.callersPerProc) // x GOMAXPROCS callers
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						k := n.Add(1)
						req := api.StartRequest{ID: fmt.Sprint("r", k), Name: "echo", Queue: "shared", Input: json.RawMessage(`{"n":1}`)}
						res, err := c.Start(context.Background(), StartParams{Tenant: fmt.Sprint("bench", k%int64(shape.tenants)), Req: req})
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
}

// BenchmarkStartGroup sends groups of 1, 6 and 27 starts from one caller,
// one group at a time, so that each op is one start group's round trip
// (the statement, its commit and the wait for its flush) and the fixed
// cost of a group shows against its cost per start. The mix sends groups
// of 2 to 8 starts (docs/benchmarks.md).
func BenchmarkStartGroup(b *testing.B) {
	for _, size := range []int{1, 6, 27} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			db := testsvc.NewDB(b)
			var groups, started atomic.Int64
			c := NewCommitter(db, 0, CommitterOptions{Admitter: ruleAdmitter{}, AfterCommit: func(cs []Committed) {
				groups.Add(1)
				started.Add(int64(len(cs)))
			}})
			b.Cleanup(c.Close)
			ps := make([]StartParams, size)
			n := 0
			b.ResetTimer()
			for range b.N {
				for i := range ps {
					n++
					key := fmt.Sprint("k", n%5)
					req := api.StartRequest{ID: fmt.Sprint("r", n), Name: "echo", Queue: "shared",
						FairnessKey: &key, Input: json.RawMessage(`{"n":1}`)}
					ps[i] = StartParams{Tenant: fmt.Sprint("bench", n%3), Req: req}
				}
				for _, o := range c.StartMany(context.Background(), ps) {
					require.NoError(b, o.Err)
					require.True(b, o.Result.Created)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size), "ns/start")
			if g := groups.Load(); g > 0 {
				b.ReportMetric(float64(started.Load())/float64(g), "starts/group")
			}
		})
	}
}
