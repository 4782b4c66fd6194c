package worker

import (
	"context"
	"time"

	"github.com/harvest-run/harvest/internal/sqlfile"
)

// DefaultPresenceInterval is how often a worker renews its presence rows
// (worker_presence: one per queue it claims from). A reader counts a
// worker as live for presenceLiveIntervals of them after its last renewal,
// so one or two lost renewals do not make a queue look unserved.
const DefaultPresenceInterval = 10 * time.Second

// presenceLiveIntervals is how many presence intervals a row stays live.
const presenceLiveIntervals = 3

// presenceTimeout bounds one presence statement: presence is advisory, so
// a slow database must not hold the worker up for long.
const presenceTimeout = 5 * time.Second

var (
	sqlPresenceUpsert = sqlfile.Must(sqlFiles, "WorkerPresenceUpsert")
	sqlPresenceDelete = sqlfile.Must(sqlFiles, "WorkerPresenceDelete")
)

// presenceInterval is the configured interval, or the default.
func (w *Worker) presenceInterval() time.Duration {
	if w.cfg.PresenceInterval > 0 {
		return w.cfg.PresenceInterval
	}
	return DefaultPresenceInterval
}

// announce upserts the worker's presence rows. A failure is logged and
// otherwise ignored: presence only feeds the "why is my run waiting"
// answer, never the claims.
func (w *Worker) announce(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), presenceTimeout)
	defer cancel()
	live := presenceLiveIntervals * w.presenceInterval()
	if _, err := w.db.Exec(ctx, sqlPresenceUpsert, w.cfg.ID, w.cfg.QueueNames(), w.cfg.FairnessKeys,
		live.Microseconds()); err != nil {
		w.log.Warn("presence: cannot announce the worker's queues", "err", err)
	}
}

// presence renews the worker's rows every interval until ctx ends. The
// first announcement is made by Run before the worker is ready.
func (w *Worker) presence(ctx context.Context) {
	t := time.NewTicker(w.presenceInterval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.announce(ctx)
		}
	}
}

// withdraw deletes the worker's presence rows at a clean stop, so its
// queues look unserved at once rather than after the rows expire.
func (w *Worker) withdraw(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), presenceTimeout)
	defer cancel()
	if _, err := w.db.Exec(ctx, sqlPresenceDelete, w.cfg.ID, w.cfg.QueueNames()); err != nil {
		w.log.Warn("presence: cannot withdraw the worker's queues", "err", err)
	}
}
