package fuzz

import (
	"net/http"
	"os"
	"testing"

	"github.com/harvest-run/harvest/pkg/fairkeys"
)

// Found by FuzzWeightBody and FuzzQuotaBody: a queue name that is not valid
// UTF-8, or that holds a NUL byte, passes fairkeys.ValidateQueueName (and
// so weights.ValidateQueue), while keys are checked for UTF-8. On the operator routes the path value
// reaches Postgres, which refuses it (SQLSTATE 22021), and the fan-out
// counts that as a shard error: DELETE /v1/queues/%CE/weights/k and GET
// /v1/queues/%82/quotas/k answer 503 ("no shard took the write", "no
// shard answered") instead of 400 naming the queue. Skipped unless
// HARVEST_KNOWN_BUGS is set.
func TestQueueNameMustBeValidUTF8(t *testing.T) {
	if os.Getenv("HARVEST_KNOWN_BUGS") == "" {
		t.Skip("known bug, reported (set HARVEST_KNOWN_BUGS=1 to run): queue names are not checked for UTF-8")
	}
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
