// Package fairkeys holds the rules for fairness keys inside one queue.
//
// It has three parts. The validators decide which fairness keys, queue
// names and weight overrides the API accepts, and Resolve picks the key a
// run's tasks are served under. The Model is a small in-memory reference of
// the fair claim (start-time fair queuing over the keys of a queue, after
// stickiness and priority, with post-claim quota rechecks and pruning of
// idle state): it is slow and simple on purpose, so that the SQL claim in
// package claim can be tested step by step against it. The property tests
// next to it state the fairness guarantees and check them on the Model.
//
// Virtual time in the Model is a float64 per queue. Each key has a pass (the
// earliest virtual time its next claim may start) and the start of its last
// claim; the queue clock is the largest such start. A claim goes to the key
// whose start tag is least ahead of the clock, and pays 1/weight of virtual
// time, so keys share claims in proportion to their weights while they all
// have work, and a key that had none rejoins at the clock instead of
// cashing in the time it was away.
//
// Concurrent claim loops are modelled in rounds (ClaimConcurrent): all
// claimers of a round rank keys by lags from one snapshot, then claim one
// after the other against the live rows, each charge exact. A fair claimer
// first takes a key no other claimer of the round has taken, as the SQL
// claim does by locking the key's fairness row with SKIP LOCKED, and falls
// back to an already taken key only when no other key has a claimable row.
// Spreading claimers over keys keeps one key from taking several claims of
// a round ahead of keys with no debt; letting it do so moved the clock in a
// way that allowed two floods to hold a newcomer back until both drained.
package fairkeys
