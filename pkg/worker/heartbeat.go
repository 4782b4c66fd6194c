package worker

import (
	"context"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/sourcegraph/conc"

	"github.com/harvest-run/harvest/pkg/claim"
)

// heartbeats extends the leases of every task the worker is running with
// one statement per HeartbeatInterval (claim.Heartbeats), each lease fenced
// by its own token: a worker of n slots sends one heartbeat statement an
// interval, not n. Each extension rewrites only the lease's expiry, which
// no index names, so it is a HOT update wherever the row's page has room.
//
// The answer of each task decides its handler's fate: a lost lease (the
// token is not current) cancels the handler with ErrLeaseLost, a cancelled
// run with ErrRunCancelled. When the statement fails, a task whose lease
// has run out by this worker's clock since the last heartbeat that got
// through is given up too (ErrLeaseLost): the janitor may rescue it.
type heartbeats struct {
	w    *Worker
	mu   sync.Mutex
	held map[int64]*heldLease
	stop chan struct{}
	wg   conc.WaitGroup
	once sync.Once
}

// heldLease is a running task as the heartbeat loop sees it.
type heldLease struct {
	token  uuid.UUID
	cancel context.CancelCauseFunc
	until  time.Time // the lease's end as far as this worker knows
}

func newHeartbeats(w *Worker) *heartbeats {
	h := &heartbeats{w: w, held: map[int64]*heldLease{}, stop: make(chan struct{})}
	h.wg.Go(h.loop)
	return h
}

// add starts beating for c, whose handler cancel ends.
func (h *heartbeats) add(c *claimed, cancel context.CancelCauseFunc) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held[c.task.ID] = &heldLease{token: c.token, cancel: cancel, until: time.Now().Add(h.w.cfg.Lease)}
}

// remove stops beating for task id (its handler returned).
func (h *heartbeats) remove(id int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.held, id)
}

// close stops the loop; call it once no task runs.
func (h *heartbeats) close() {
	h.once.Do(func() { close(h.stop) })
	h.wg.Wait()
}

func (h *heartbeats) loop() {
	tick := time.NewTicker(h.w.cfg.HeartbeatInterval)
	defer tick.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-tick.C:
		}
		h.beat()
	}
}

// beat sends one heartbeat for every task held and acts on the answers.
func (h *heartbeats) beat() {
	h.mu.Lock()
	leases := make([]claim.Lease, 0, len(h.held))
	for id, l := range h.held {
		leases = append(leases, claim.Lease{ID: id, Token: l.token})
	}
	h.mu.Unlock()
	if len(leases) == 0 {
		return
	}
	sent := time.Now()
	// A heartbeat may take up to half the lease: one that times out
	// closes its connection, and a timeout as short as a quick interval
	// would then fail every later heartbeat while the pool connects again
	// on a loaded machine, until the leases are lost for nothing. A slow
	// heartbeat only delays the next tick.
	cfg := h.w.cfg
	ctx, done := context.WithTimeout(context.Background(), min(dbTimeout, max(cfg.HeartbeatInterval, cfg.Lease/2)))
	beats, err := claim.Heartbeats(ctx, h.w.db, leases, cfg.Lease)
	done()
	if err != nil {
		h.w.log.Warn("heartbeat failed", "tasks", len(leases), "err", err)
	}
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, lease := range leases {
		l, ok := h.held[lease.ID]
		if !ok || l.token != lease.Token {
			continue // its handler returned meanwhile
		}
		var cause error
		switch {
		case err != nil:
			if now.After(l.until) {
				cause = ErrLeaseLost
			}
		case beats[i] == claim.BeatOK:
			l.until = sent.Add(cfg.Lease)
		case beats[i] == claim.BeatCancelled:
			cause = ErrRunCancelled
		default: // stale or gone: another holder, or a cancel, has the task
			cause = ErrLeaseLost
		}
		if cause != nil {
			l.cancel(cause)
			delete(h.held, lease.ID)
		}
	}
}
