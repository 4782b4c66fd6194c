package client

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultRetryMaxDelay is the longest wait between attempts of a
// RetryPolicy whose MaxDelay is zero.
const DefaultRetryMaxDelay = 10 * time.Second

// retryBaseDelay is the first backoff step when the gateway gave no
// Retry-After: short, since a 503 is often one shard's brief failover.
const retryBaseDelay = 100 * time.Millisecond

// RetryPolicy makes the client send a call again when the gateway answers
// 429 (over the admission limit or a quota) or 503 (unavailable), and,
// for calls that are safe to repeat, when the transport fails (connection
// refused or reset, an answer cut short, a NATS request that timed out).
// Nothing is retried without a policy.
//
// Calls safe to repeat are the reads (GET), the weight and quota writes
// (PUT and DELETE set or clear a value) and the starts. A start is safe
// only because the client gives every start without an id a fresh UUIDv7
// before its first attempt and sends that same id on each retry: the
// gateway answers a start whose id exists with the same request by
// returning the existing run (200, Started.Created false) instead of
// making a second one. Cancel is not repeated on a transport error: a
// cancel that landed makes its retry a 409.
//
// The wait before an attempt is at least the answer's Retry-After (or,
// when it has none, its retry_after_ms), else a jittered exponential
// backoff from 100ms capped at MaxDelay. A wait the gateway asked for is
// lengthened by up to half again, at random, and grows like the backoff
// when the gateway keeps refusing: a gateway shedding load refuses many
// callers at once with the same Retry-After, and callers that all came
// back when it ends would be refused together again. The client gives up,
// returning the last answer's error, when MaxAttempts is reached, when the
// gateway asks for a wait longer than MaxDelay, or when ctx would end
// before the next attempt.
type RetryPolicy struct {
	// MaxAttempts counts every attempt, the first included (1 sends once).
	MaxAttempts int
	// MaxDelay caps one wait between attempts; zero means
	// DefaultRetryMaxDelay.
	MaxDelay time.Duration
}

// check validates the policy, naming the wrong field.
func (p *RetryPolicy) check() error {
	if p.MaxAttempts < 1 {
		return fmt.Errorf("client: Options.Retry.MaxAttempts must be at least 1, got %d", p.MaxAttempts)
	}
	if p.MaxDelay < 0 {
		return fmt.Errorf("client: Options.Retry.MaxDelay must not be negative, got %s", p.MaxDelay)
	}
	return nil
}

// retryable reports whether an HTTP or NATS status asks to come back later.
func retryable(status int) bool {
	return status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable
}

// again reports whether attempt n (from 1) should be followed by another,
// after waiting hint (the gateway's) or a backoff; it does the waiting.
func (c *Client) again(ctx context.Context, n int, retry bool, hint time.Duration) bool {
	p := c.retry
	if p == nil || !retry || n >= p.MaxAttempts || ctx.Err() != nil {
		return false
	}
	maxDelay := p.MaxDelay
	if maxDelay == 0 {
		maxDelay = DefaultRetryMaxDelay
	}
	if hint > maxDelay {
		// Coming back earlier than asked would only be refused again.
		return false
	}
	wait := retryWait(n, hint, maxDelay)
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
		// The jitter may not fit where the asked wait does.
		wait = hint
		if hint <= 0 || time.Until(deadline) < wait {
			// The attempt could not be sent in time: answer now.
			return false
		}
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// retryWait is the wait after attempt n (from 1) when the gateway asked
// for hint (zero: it did not): never less than hint nor more than
// maxDelay (which hint does not exceed), the larger of hint and the
// backoff, plus up to half of it at random.
func retryWait(n int, hint, maxDelay time.Duration) time.Duration {
	if hint <= 0 {
		return backoff(n, maxDelay)
	}
	d := hint
	for i := 1; i < n && d < maxDelay; i++ {
		d *= 2
	}
	d = min(d, maxDelay)
	return min(d+rand.N(d/2+1), max(maxDelay, hint))
}

// backoff is the wait after attempt n without a hint: doubling from
// retryBaseDelay up to maxDelay, drawn from its upper half so that clients
// refused together do not come back together.
func backoff(n int, maxDelay time.Duration) time.Duration {
	d := retryBaseDelay
	for i := 1; i < n && d < maxDelay; i++ {
		d *= 2
	}
	d = min(d, maxDelay)
	half := d / 2
	return half + rand.N(d-half+1)
}

// parseRetryAfter reads a Retry-After header given in seconds (the form
// the gateway sends); an HTTP date or garbage counts as absent.
func parseRetryAfter(v string) time.Duration {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}
