package testsvc

import (
	"os"
	"testing"

	"github.com/harvest-run/harvest/internal/natsembed"
)

// EnvNATSURL names the environment variable that points tests at an
// external NATS server instead of an embedded one.
const EnvNATSURL = "HARVEST_TEST_NATS_URL"

// NATSURL returns the URL of a NATS server with JetStream for this test:
// the external server named by HARVEST_TEST_NATS_URL when it is set,
// otherwise an embedded server started for this test alone and shut down
// when the test ends.
func NATSURL(t testing.TB) string {
	t.Helper()
	return natsURL(t, os.Getenv(EnvNATSURL))
}

func natsURL(t testing.TB, external string) string {
	t.Helper()
	if external != "" {
		return external
	}
	s, err := natsembed.Start(natsembed.Options{})
	if err != nil {
		t.Fatalf("testsvc: start embedded NATS server: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s.URL()
}
