// Package deferred implements the starts that fire a run later: throttled
// (at most limit runs per period for a key, the excess waiting in arrival
// order), debounced (one run for a burst of starts, fired after a quiet
// period with the last start's request, capped by max_wait) and batched
// (one run whose input is the list of the gathered starts' inputs, fired
// at max_size or max_wait). docs/deferred.md describes the behaviour users
// see; this comment describes how it is kept exact.
//
// Everything lives in the tenant's home shard (migration 0004): a waiting
// run is a deferred_groups row plus, for debounce and batch, one
// deferred_starts row per start. The run a group will fire already exists
// in runs with status 'deferred' and no task. That row reserves the id
// against ordinary starts (same idempotency path, so a different request
// with that id is a 409), answers GET and listings, can be cancelled, and
// counts in the tenant's running count: admission is decided when a start
// is accepted and the slot is held until the run is final (see Accept).
// Every start is asked, including one that joins an open window or batch:
// it is judged as if it added a run, and adds none, so the count stays
// the number of unfinished runs while a tenant at its limit cannot feed
// its windows. A debounce window takes at most DebounceMaxStarts starts
// (the last one fires it) and stays open at most max_wait, or
// DebounceMaxOpen without one; a batch is bounded by max_size and
// max_wait.
//
// Firing (Fire, called by every worker's janitor tick, and by Accept when a
// batch fills) replaces the deferred row by the real run through
// runstore.StartTx, which writes the run, its first task and the count the
// way every start does, in the same transaction that marks the group
// fired. A group is fired under its row lock and only while it is pending,
// and throttle keys are fired under a per-key advisory lock, so any number
// of firers and gateways racing make exactly one run per throttled start,
// per debounce window and per batch. Nothing is held in memory: a firer
// that restarts, or another one, finds the same rows.
//
// Cancel cancels what a start's id stands for. A waiting run is cancelled
// under the tenant's count lock, so it cannot interleave with a firing: it
// either closes the group before it fires, or cancels the run it became.
//
// The ids of debounce and batch starts are kept in deferred_starts, not in
// runs, so migration 0005 adds a trigger that stops an ordinary start from
// taking one of them for a run.
//
// Lock order, shared with the start committer: the tenant's count row,
// then the throttle key, then the group, then the run, then the key
// summaries written by the start.
package deferred
