package faults

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
	"github.com/harvest-run/harvest/tools/internal/soak"
)

// The system limit holds across gateway processes and shards: three
// gateway binaries over two shards, three tenants living on both, and 50
// concurrent clients pressing past HARVEST_MAX_RUNS leave at most that
// many unfinished runs, and starts sent one at a time afterwards fill the
// system to exactly that many (no capacity stays stuck in a lease). No
// worker runs, so every admitted run stays unfinished.
func TestSystemLimitExactAcrossGatewayProcesses(t *testing.T) {
	t.Parallel()
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) })
	const maxRuns = 30
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	f, err := soak.Start(ctx, soak.Options{Bins: bins, ShardURLs: []string{testsvc.NewDBURL(t), testsvc.NewDBURL(t)},
		Gateways: 3, NoWorkers: true, MaxRuns: maxRuns, Dir: t.TempDir(), Logf: t.Logf})
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("process logs:\n%s", f.Logs())
		}
		f.Close()
	})
	tenants := f.Tenants()
	homes := map[int]bool{}
	for _, tn := range tenants {
		homes[shards.Home(tn, 2)] = true
	}
	require.Len(t, homes, 2, "the tenants live on both shards: %v", tenants)

	// start sends one start until it is answered with anything but 503
	// (a gateway whose shard connections are still being opened).
	start := func(c *client.Client, id string) error {
		for {
			_, err := c.Start(ctx, "echo", soak.Queue, nil, client.StartOptions{ID: id})
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Code != api.CodeUnavailable || ctx.Err() != nil {
				return err
			}
		}
	}
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	begin := make(chan struct{})
	for c := range 50 {
		cl := f.Tenant(tenants[c%len(tenants)], (c/len(tenants))%3)
		wg.Go(func() {
			<-begin
			for i := range 4 {
				err := start(cl, fmt.Sprintf("c%d-%d", c, i))
				var ae *api.Error
				switch {
				case err == nil:
					admitted.Add(1)
				case errors.As(err, &ae) && ae.Code == api.CodeOverLimit:
					refused.Add(1)
				default:
					t.Error(err)
				}
			}
		})
	}
	close(begin)
	wg.Wait()
	t.Logf("%d admitted, %d refused", admitted.Load(), refused.Load())
	require.Positive(t, refused.Load(), "the clients pressed past the limit")
	require.LessOrEqual(t, f.Unfinished(ctx), maxRuns)
	require.EqualValues(t, admitted.Load(), f.Unfinished(ctx), "every admitted run is there, and nothing else")

	for i := 0; f.Unfinished(ctx) < maxRuns; i++ {
		require.Less(t, i, 3*maxRuns, "capacity was lost: %d unfinished", f.Unfinished(ctx))
		err := start(f.Tenant(tenants[i%len(tenants)], i%3), fmt.Sprint("fill-", i))
		var ae *api.Error
		if err != nil && (!errors.As(err, &ae) || ae.Code != api.CodeOverLimit) {
			require.NoError(t, err)
		}
	}
	for i := range 3 {
		err := start(f.Tenant(tenants[i], i), fmt.Sprint("over-", i))
		var ae *api.Error
		require.True(t, errors.As(err, &ae) && ae.Code == api.CodeOverLimit, "%v", err)
	}
	require.Equal(t, maxRuns, f.Unfinished(ctx))
}
