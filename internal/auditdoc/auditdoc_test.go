package auditdoc

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// Text keeps short text as it is and cuts long text on a character
// boundary, marked, within the bound: whatever the caller sent, the row
// holds valid UTF-8 without NUL of at most the bound.
func TestTextIsBoundedAndStorable(t *testing.T) {
	t.Parallel()
	require.Equal(t, "unknown query parameter", Text("unknown query parameter", MaxTextBytes))
	for _, in := range []string{
		strings.Repeat("x", 64<<10),
		strings.Repeat("é", 40<<10), // two bytes each: the cut must not split one
		strings.Repeat("注", 30<<10), // three bytes each
		strings.Repeat("\xff\x00a", 20<<10),
	} {
		out := Text(in, MaxTextBytes)
		require.LessOrEqual(t, len(out), MaxTextBytes)
		require.True(t, utf8.ValidString(out))
		require.NotContains(t, out, "\x00")
		require.True(t, strings.HasSuffix(out, Marker), "a cut is marked")
	}
	require.Equal(t, "a\uFFFDb", Text("a\xffb\x00", MaxTextBytes), "storable: bad bytes replaced, NUL dropped")
	require.Len(t, Text(strings.Repeat("x", 100), 4), 4, "a bound below the marker's size still holds")
}

// Value keeps a small JSON document as it is, and turns anything else into
// {"body": text} of at most MaxBytes, marked when cut, even when JSON
// escaping makes each byte of text several bytes of document.
func TestValueIsBoundedAndStorable(t *testing.T) {
	t.Parallel()
	require.Nil(t, Value(nil))
	require.Equal(t, `{"weight":2}`, string(Value([]byte(`{"weight":2}`))))
	for _, c := range []struct {
		in  string
		cut bool
	}{
		{strings.Repeat("a", MaxBytes+1), true},
		{strings.Repeat("\x01", MaxBytes+1), true}, // six bytes each once escaped
		{strings.Repeat(`"`, 3000), true},          // two bytes each
		{`{"name": "` + strings.Repeat("\u2028", 2000) + `"}`, true},
		{`{"input": "\u0000"}`, false}, // JSON that Postgres cannot store
		{"\xff\xfe{", false},
	} {
		out := Value([]byte(c.in))
		require.LessOrEqual(t, len(out), MaxBytes)
		var doc map[string]string
		require.NoError(t, json.Unmarshal(out, &doc), "%q", out)
		require.Contains(t, doc, "body")
		require.True(t, utf8.ValidString(doc["body"]))
		require.NotContains(t, doc["body"], "\x00")
		require.Equal(t, c.cut, strings.HasSuffix(doc["body"], Marker), "%.40q", out)
	}
}
