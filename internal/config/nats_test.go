package config

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// HARVEST_NATS_URL takes one URL or a cluster's list; each is checked and
// an error names the variable and the server at fault.
func TestNATSURLList(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"nats://a:4222"}, NATSURLs("nats://a:4222"))
	require.Equal(t, []string{"nats://u:p@a:4222", "tls://b:4222", "c:4222"}, NATSURLs(" nats://u:p@a:4222 ,tls://b:4222,c:4222 "))
	require.Empty(t, NATSURLs("  "))

	for _, ok := range []string{
		"nats://127.0.0.1:4222",
		"nats://harvest:secret@nats1:4222,nats://harvest:secret@nats2:4222,nats://harvest:secret@nats3:4222",
		"tls://a:4222, wss://b:443",
		"localhost:4222", // nats.go reads a bare host:port as nats://
	} {
		require.NoError(t, ValidateNATSURL(ok), ok)
	}
	for v, want := range map[string]string{
		"":                             "HARVEST_NATS_URL: empty",
		"nats://a:4222,,nats://b:4222": "HARVEST_NATS_URL: server 2 of 3 is empty",
		"nats://a:4222,":               "HARVEST_NATS_URL: server 2 of 2 is empty",
		"nats://a:4222,http://b:80":    `HARVEST_NATS_URL: server 2 of 2: "http://b:80": scheme "http"`,
		"nats://a:4222,nats://:4222":   `HARVEST_NATS_URL: server 2 of 2: "nats://:4222" names no host`,
		"nats://a:4222,nats://a b:1":   "HARVEST_NATS_URL: server 2 of 2 is not a URL",
	} {
		require.ErrorContains(t, ValidateNATSURL(v), want, v)
	}
}

// A password in a NATS URL never reaches an error message.
func TestNATSURLErrorsHidePasswords(t *testing.T) {
	t.Parallel()
	for _, v := range []string{
		"nats://a:4222,http://harvest:hunter2@b:80",
		"nats://a:4222,nats://harvest:hunter2@:4222",
		"nats://a:4222,harvest:hunter2@:4222",
		"nats://harvest:hunter2@a b:4222",
	} {
		err := ValidateNATSURL(v)
		require.Error(t, err, v)
		require.NotContains(t, err.Error(), "hunter2", v)
	}
}

// Common.Validate applies the list's checks to HARVEST_NATS_URL.
func TestCommonValidatesEveryNATSURL(t *testing.T) {
	t.Parallel()
	c := Common{Shards: Shards{"postgres://a/x"}, NATSURL: "nats://a:4222,nats://b:4222"}
	require.NoError(t, c.Validate())
	c.NATSURL = "nats://a:4222,mysql://b:4222"
	require.ErrorContains(t, c.Validate(), "HARVEST_NATS_URL: server 2 of 2")
}
