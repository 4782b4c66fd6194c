package claim

import (
	"context"
	"github.com/harvest-run/harvest/pkg/shard"
	"sync"
	"time"
)

// DefaultMaxCombined bounds how many waiting claims a Claimer puts into one
// statement.
const DefaultMaxCombined = 256

// rejoinWindow is how long after answering a statement's claims a Claimer
// expects their callers back: a claim that opens a statement within it
// waits, at most that long after the answer, for as many claims to join as
// the last statement had. Callers that claim again at once (claim loops
// with nothing to do between claims) then share one statement instead of
// one going alone and the others waiting for it; callers that run a task
// first come back later and never wait.
const rejoinWindow = 300 * time.Microsecond

// Claimer claims for the goroutines of one process that share a database
// handle, such as the claim loops of a worker. The fair claims of a queue
// take turns on the queue's fair lock anyway, so a Claimer sends the fair
// claims that wait at the same time for the same request as one batch
// statement (ClaimBatch): one turn on the lock and one commit for all of
// them, with the rows handed out in the order the batch took them, which is
// the order as many single claims in a row would take. Only one such
// statement per request is in flight; claims that arrive meanwhile wait for
// the next one. Ordinary claims go straight to Claim: they do not wait for
// each other.
//
// A Claimer is safe for concurrent use. Its zero value is not usable: make
// one with NewClaimer.
type Claimer struct {
	db shard.Querier
	// MaxCombined bounds the claims of one statement (DefaultMaxCombined
	// when zero).
	MaxCombined int

	mu     sync.Mutex
	groups map[Request]*combineGroup
	// last is, per request, when the last statement's claims were answered
	// and how many there were.
	last map[Request]answered
}

type answered struct {
	at time.Time
	n  int
}

// NewClaimer returns a Claimer over db, which should be a pool: claims
// combined into one statement are sent on it while other statements go on.
func NewClaimer(db shard.Querier) *Claimer {
	return &Claimer{db: db, groups: map[Request]*combineGroup{}, last: map[Request]answered{}}
}

// combineGroup holds the claims of one request: those waiting for the next
// statement, and whether a statement is in flight.
type combineGroup struct {
	waiting []*combined
	busy    bool
	// arrived is signalled (without blocking) by each claim that joins.
	arrived chan struct{}
}

// combined is one caller's claim. lead is closed (and chosen set, under
// the Claimer's lock) when the caller is to send the next statement for its
// group; done is closed when its result is set.
type combined struct {
	lead   chan struct{}
	chosen bool
	done   chan struct{}
	res    Result
	err    error
}

// Claim takes one task as the package's Claim does. A fair claim may be
// sent together with other callers' claims of the same request; once it is
// part of a statement it waits for that statement's result even if ctx
// ends, so a task leased for it is never lost on the way.
func (c *Claimer) Claim(ctx context.Context, req Request) (Result, error) {
	if !req.Fair {
		return Claim(ctx, c.db, req)
	}
	if err := req.validate(); err != nil {
		return Result{}, err
	}
	me := &combined{lead: make(chan struct{}), done: make(chan struct{})}
	c.mu.Lock()
	g := c.groups[req]
	if g == nil {
		g = &combineGroup{arrived: make(chan struct{}, 1)}
		c.groups[req] = g
	}
	g.waiting = append(g.waiting, me)
	select {
	case g.arrived <- struct{}{}:
	default:
	}
	leading := !g.busy
	g.busy = true
	c.mu.Unlock()

	if !leading {
		select {
		case <-me.lead:
		case <-me.done:
			return me.res, me.err
		case <-ctx.Done():
			if c.withdraw(g, me) {
				return Result{}, ctx.Err()
			}
			// Already part of a statement (or chosen to send the next
			// one): see it through.
			select {
			case <-me.lead:
			case <-me.done:
				return me.res, me.err
			}
		}
	}
	c.send(ctx, req, g)
	<-me.done
	return me.res, me.err
}

// withdraw takes a waiting claim out of its group before it is sent. A
// claim chosen to send the next statement cannot leave: the others wait
// for it.
func (c *Claimer) withdraw(g *combineGroup, me *combined) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if me.chosen {
		return false
	}
	for i, w := range g.waiting {
		if w == me {
			g.waiting = append(g.waiting[:i], g.waiting[i+1:]...)
			return true
		}
	}
	return false
}

// send takes every claim waiting in the group (up to MaxCombined), claims
// for them in one statement, hands the results out in order, and passes
// the turn to the first claim that arrived meanwhile, or ends the group's
// busy spell.
func (c *Claimer) send(ctx context.Context, req Request, g *combineGroup) {
	limit := c.MaxCombined
	if limit <= 0 {
		limit = DefaultMaxCombined
	}
	c.mu.Lock()
	if a, ok := c.last[req]; ok {
		deadline := a.at.Add(rejoinWindow)
		for len(g.waiting) < min(a.n, limit) && time.Now().Before(deadline) {
			c.mu.Unlock()
			t := time.NewTimer(time.Until(deadline))
			select {
			case <-g.arrived:
			case <-t.C:
			}
			t.Stop()
			c.mu.Lock()
		}
	}
	n := min(len(g.waiting), limit)
	batch := append([]*combined(nil), g.waiting[:n]...)
	g.waiting = append(g.waiting[:0], g.waiting[n:]...)
	c.mu.Unlock()

	// The statement outlives the caller that sends it: the others are
	// waiting for their rows.
	sctx := context.WithoutCancel(ctx)
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		sctx, cancel = context.WithDeadline(sctx, dl)
		defer cancel()
	}
	// The turn passes on as soon as this statement has committed (the
	// queue's lock is free again), while this one still waits for its
	// flush; at the latest it passes when the statement failed.
	var once sync.Once
	pass := func() { once.Do(func() { c.passTurn(req, g) }) }
	rs, err := claimBatch(sctx, c.db, req, len(batch), pass)
	pass()
	for i, w := range batch {
		switch {
		case err != nil:
			w.err = err
		case i < len(rs) && rs[i].OK:
			w.res = rs[i]
		case len(rs) > 0 && !rs[len(rs)-1].OK:
			// The batch stopped early: the claims it did not serve get its
			// reason (refusals, or nothing to take), as single claims
			// sent after it would.
			w.res = rs[len(rs)-1]
		default:
			w.res = Result{Empty: EmptyNoTask}
		}
		close(w.done)
	}
	c.mu.Lock()
	now := time.Now()
	c.last[req] = answered{at: now, n: len(batch)}
	if len(c.last) > 64 {
		for r, a := range c.last {
			if now.Sub(a.at) > rejoinWindow {
				delete(c.last, r)
			}
		}
	}
	c.mu.Unlock()
}

// passTurn hands the group's next statement to the first claim waiting, or
// ends the group's busy spell.
func (c *Claimer) passTurn(req Request, g *combineGroup) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(g.waiting) > 0 {
		g.waiting[0].chosen = true
		close(g.waiting[0].lead)
		return
	}
	g.busy = false
	delete(c.groups, req)
}
