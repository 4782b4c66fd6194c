package dispatch

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEncodeTokenExamples(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"shared":     "shared",
		"orders.eu":  "orders%2Eeu",
		"a b":        "a%20b",
		"*":          "%2A",
		">":          "%3E",
		"100%":       "100%25",
		"":           "%",
		"ü":          "%C3%BC",
		"tenant_A-1": "tenant_A-1",
	}
	for in, want := range cases {
		require.Equal(t, want, EncodeToken(in), "encode %q", in)
		back, err := DecodeToken(want)
		require.NoError(t, err)
		require.Equal(t, in, back)
	}
}

func TestDecodeTokenRefusesNonCanonical(t *testing.T) {
	t.Parallel()
	for _, tok := range []string{"", "a%2", "a%", "%2e", "%41", "a.b", "%ZZ"} {
		_, err := DecodeToken(tok)
		require.True(t, errors.Is(err, ErrBadToken), "token %q: %v", tok, err)
	}
}

func TestSubjects(t *testing.T) {
	t.Parallel()
	s := Subjects{}
	require.Equal(t, "harvest.start.acme", s.Start("acme"))
	require.Equal(t, "harvest.start_batch.acme", s.StartBatch("acme"))
	require.Equal(t, "harvest.wake.1.orders%2Eeu", s.Wake(1, "orders.eu"))
	require.Equal(t, "harvest.dispatch.0.shared", s.Dispatch(0, "shared"))
	require.Equal(t, "harvest.weights.a%20b", s.Weights("a b"))
	require.Equal(t, "harvest.runs.acme.run%2E1", s.Runs("acme", "run.1"))
	require.Equal(t, "harvest.handle.send%2Amail", s.Handle("send*mail"))
	require.Equal(t, "hv.start.*", Subjects{Prefix: "hv"}.StartAll())
}

func FuzzTokenRoundTrip(f *testing.F) {
	for _, s := range []string{"", "shared", "orders.eu", "a b>c*", "\x00\xff", "%41"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		tok := EncodeToken(name)
		require.NotEmpty(t, tok)
		for i := 0; i < len(tok); i++ {
			c := tok[i]
			require.True(t, safeByte(c) || c == '%', "unsafe byte %q in %q", c, tok)
		}
		back, err := DecodeToken(tok)
		require.NoError(t, err)
		require.Equal(t, name, back)
		// Any token that decodes must be the one encoding of its name.
		if got, err := DecodeToken(name); err == nil {
			require.Equal(t, name, EncodeToken(got))
		}
	})
}
