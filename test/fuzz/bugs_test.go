package fuzz

import (
	"net/http"
	"testing"

	"github.com/harvest-run/harvest/pkg/fairkeys"
)

// Regression, found by FuzzWeightBody and FuzzQuotaBody: a queue name that
// is not valid UTF-8, or that holds a NUL byte, must be refused with 400
// naming the queue. It used to pass the name check and reach Postgres, which
// refused it, so the fan-out answered 503.
func TestQueueNameMustBeValidUTF8(t *testing.T) {
	t.Parallel()
	if err := fairkeys.ValidateQueueName("\xce"); err == nil {
		t.Errorf(`fairkeys.ValidateQueueName("\xce") accepts a name that is not UTF-8`)
	}
	if err := fairkeys.ValidateQueueName("a\x00b"); err == nil {
		t.Errorf(`fairkeys.ValidateQueueName("a\x00b") accepts a NUL byte`)
	}
	for _, path := range []string{"/v1/queues/%CE/weights/k", "/v1/queues/%00/weights/k", "/v1/queues/%82/quotas/k"} {
		tg := newTarget(t, false)
		for _, method := range []string{"GET", "DELETE"} {
			if method == "GET" && path != "/v1/queues/%82/quotas/k" {
				continue // no GET of one weight
			}
			status, body := tg.call(t, method, path, nil, adminSecret)
			if status != http.StatusBadRequest {
				t.Errorf("%s %s: %d, want 400: %s", method, path, status, body)
			}
		}
	}
}
