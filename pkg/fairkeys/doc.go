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
// The Model is sequential, and so is what it models: the SQL fair claims of
// a queue hold the queue's fair lock one after the other, each seeing every
// charge committed before it, so any number of concurrent claim loops give
// the same claims as some sequence of single Model claims (the order in
// which they took the lock). Starts, cancels and completions that commit
// while a claim runs take their place in that sequence before or after it.
// Ordinary claims take no lock and skip rows other claims hold, which is
// the same as coming after them. The guarantees below therefore hold for
// any number of claimers with no allowance for concurrency, and the
// database tests check that they do.
package fairkeys
