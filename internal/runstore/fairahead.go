package runstore

import "math"

// FairKey is one fairness key as the estimate of the fair order sees it.
type FairKey struct {
	Key string
	// Pass is the key's pass in the queue's start-time fair queuing state;
	// nil when the key has never been charged (it starts at the clock).
	Pass *float64
	// Weight is the key's weight (1 without an override).
	Weight float64
	// Pending is the key's due pending tasks at the run's priority. The
	// reader may stop counting where no more of them could be ahead.
	Pending int
	// Higher says the key has a due pending task of a higher priority
	// than the run's: such a task is ahead whatever the key's lag.
	Higher bool
}

// FairInput is what FairAhead needs of a fair queue for one pending task.
type FairInput struct {
	// Clock is the queue's virtual clock V (fair_queues.clock).
	Clock float64
	// Own is the task's key; Own.Pending is the number of its tasks at
	// the run's priority that come before it in the key's own order
	// (a_k), Own.Higher is ignored.
	Own FairKey
	// HigherAhead is the queue's due pending tasks of a higher priority:
	// all are claimed first.
	HigherAhead int
	// Others are the other keys with pending work.
	Others []FairKey
	// Capped says the inputs are incomplete (more keys than were read, or
	// counts that stopped at their cap): the result is a lower bound.
	Capped bool
}

// FairResult is the estimate of where a task stands in the fair order.
type FairResult struct {
	// StartTag is the virtual start time S of the task's claim.
	StartTag float64
	// KeysAhead counts the other keys with at least one task ahead.
	KeysAhead int
	// ClaimsAhead is about how many claims come before the task's.
	ClaimsAhead int
	// AtLeast says the figures are lower bounds (FairInput.Capped).
	AtLeast bool
}

// tagOf is a key's next start tag: its pass, pulled up to the clock (a
// key without state, or one that went idle, starts at the clock), as the
// claim's charge takes it (pkg/fairkeys startTag).
func tagOf(k FairKey, clock float64) float64 {
	if k.Pass != nil && *k.Pass > clock {
		return *k.Pass
	}
	return clock
}

// weightOf is the key's weight, 1 when none was given.
func weightOf(k FairKey) float64 {
	if k.Weight > 0 {
		return k.Weight
	}
	return 1
}

// claimsBefore is how many claims of a key whose next start tag is tag
// and whose weight is w start before the virtual time s: its i-th next
// claim starts at tag + i/w, so those with i < (s - tag) * w. A tie is
// not counted (the claim then compares the rows themselves). The small
// tolerance keeps a float product like 2.0000000001 from counting one
// claim too many.
func claimsBefore(tag, w, s float64) int {
	if s <= tag {
		return 0
	}
	n := math.Ceil((s-tag)*w - 1e-9)
	if n <= 0 {
		return 0
	}
	if n > math.MaxInt32 {
		return math.MaxInt32
	}
	return int(n)
}

// FairAhead estimates how many claims of a fair queue come before a
// pending task, with the start-time fair queuing rule of the claim
// (pkg/fairkeys Claim): priority first, then the keys' start tags. The
// task's claim starts at S = max(pass_k, V) + a_k / w_k; every task of a
// higher priority is ahead, and of every other key j at the same priority
// about min(pending_j, ceil((S - max(pass_j, V)) * w_j)) tasks are.
//
// It is an estimate of one-level queues charged one per claim: it leaves
// out that the higher-priority claims move the keys' passes and the clock
// too, ties between equal start tags (decided by the rows), ageing, and
// work that arrives later. Two-level queues and runtime charging would add
// their own terms here.
func FairAhead(in FairInput) FairResult {
	s := tagOf(in.Own, in.Clock) + float64(max(in.Own.Pending, 0))/weightOf(in.Own)
	res := FairResult{StartTag: s, AtLeast: in.Capped}
	res.ClaimsAhead = max(in.HigherAhead, 0) + max(in.Own.Pending, 0)
	for _, k := range in.Others {
		n := min(max(k.Pending, 0), claimsBefore(tagOf(k, in.Clock), weightOf(k), s))
		res.ClaimsAhead += n
		if n > 0 || k.Higher {
			res.KeysAhead++
		}
	}
	return res
}
