package soak

import (
	"sync"
	"time"
)

// standInVacuum is what the harness runs on each shard in place of
// autovacuum when the server runs without it (a test server, as here).
// It analyzes as well as vacuums, as autovacuum does: without statistics
// the planner costs the claim's and the outcomes' generic plans as if
// every equality on a queue or key selected a handful of rows, and keeps
// plans a running shard would never use (a scan of every pending row of
// a queue to lock the few rows a bulk claim planned, say).
const standInVacuum = `VACUUM (ANALYZE, SKIP_LOCKED)`

// standInFirst and standInEvery: the stand-in runs first once the load
// has written some rows, and then once a minute, autovacuum's default
// naptime, so a run reaches the statistics a long-lived shard has within
// its first step rather than never.
const (
	standInFirst = 10 * time.Second
	standInEvery = time.Minute
)

// standInNote is the line the reports print when the harness stands in.
const standInNote = "autovacuum is off on this server: the harness vacuums and analyzes each shard in its place, " +
	"10 s into the load and then once a minute (counted as the database's work)"

// standInTicker fires at standInFirst and then every standInEvery; one
// made off (the server runs its own autovacuum) never fires.
type standInTicker struct {
	c    chan time.Time
	done chan struct{}
	once sync.Once
}

// newStandInTicker starts the stand-in's schedule when on is true.
func newStandInTicker(on bool) *standInTicker {
	t := &standInTicker{c: make(chan time.Time), done: make(chan struct{})}
	if !on {
		return t
	}
	go func() {
		timer := time.NewTimer(standInFirst)
		defer timer.Stop()
		for {
			select {
			case now := <-timer.C:
				select {
				case t.c <- now:
				case <-t.done:
					return
				}
				timer.Reset(standInEvery)
			case <-t.done:
				return
			}
		}
	}()
	return t
}

// C is the channel the stand-in's times arrive on.
func (t *standInTicker) C() <-chan time.Time { return t.c }

// Stop ends the schedule.
func (t *standInTicker) Stop() { t.once.Do(func() { close(t.done) }) }
