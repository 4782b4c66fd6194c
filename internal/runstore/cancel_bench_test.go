package runstore

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
)

// BenchmarkCancel measures cancels of queued runs of one tenant (so each
// lowers the same count row), from one caller and from eight at once, as
// a gateway sends them. Besides the time per cancel it reports the
// benchmark process's own CPU per cancel (the caller's share: a gateway's
// work for it), read from getrusage.
func BenchmarkCancel(b *testing.B) {
	for _, callers := range []int{1, 8} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			db := testsvc.NewDB(b)
			ctx := context.Background()
			c := NewCommitter(db, 0, CommitterOptions{})
			for i := range b.N {
				req := api.StartRequest{ID: fmt.Sprint("r", i), Name: "echo", Queue: "shared", Input: json.RawMessage(`{"n":1}`)}
				_, err := c.Start(ctx, StartParams{Tenant: "bench", Req: req})
				require.NoError(b, err)
			}
			c.Close()
			var next atomic.Int64
			cpu0 := processCPU(b)
			b.ResetTimer()
			b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0))) // callers in all
			if callers == 1 {
				for i := range b.N {
					res, err := Cancel(ctx, db, "bench", fmt.Sprint("r", i), 0, "bench")
					require.NoError(b, err)
					require.True(b, res.Cancelled)
				}
			} else {
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						i := next.Add(1) - 1
						res, err := Cancel(ctx, db, "bench", fmt.Sprint("r", i), 0, "bench")
						require.NoError(b, err)
						require.True(b, res.Cancelled)
					}
				})
			}
			b.StopTimer()
			b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "caller-cpu-µs/op")
		})
	}
}

// processCPU is the process's user and system CPU so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
