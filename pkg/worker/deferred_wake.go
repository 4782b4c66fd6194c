package worker

import (
	"context"

	"github.com/harvest-run/harvest/internal/janitor"
	"github.com/harvest-run/harvest/pkg/dispatch"
)

// janitorTick is the janitor's per-tick callback: it announces the runs
// the tick fired from deferred starts (throttle, debounce, batch), then
// calls the Janitor test hook. Every worker serving such a queue on this
// shard wakes up, as for a start made at the gateway; this worker's own
// loops are woken directly too, so a worker without NATS does not wait for
// its next poll either.
func (w *Worker) janitorTick(rep janitor.Report, err error) {
	if queues := rep.WakeQueues(); len(queues) > 0 {
		if w.nc != nil {
			for q, n := range queues {
				if perr := dispatch.Publish(context.Background(), w.nc, w.subj.Wake(w.cfg.Shard, q), dispatch.Wake{Tasks: n}); perr != nil {
					w.log.Warn("publish wake-up for fired deferred starts", "queue", q, "err", perr)
				}
			}
		}
		w.wake.fire()
	}
	if w.hooks.Janitor != nil {
		w.hooks.Janitor(janitorReport(rep), err)
	}
}
