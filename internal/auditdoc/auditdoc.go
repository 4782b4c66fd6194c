// Package auditdoc turns what a caller sent into a value an audit row can
// keep, for every writer of refused changes.
package auditdoc

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// MaxBytes bounds what an audit row keeps of a refused request.
const MaxBytes = 4096

// Value is attempted as a jsonb value: the JSON itself when it is a small
// valid document Postgres can store, otherwise {"body": "<text>"} with the
// first MaxBytes of it as valid text; nil for nothing sent.
func Value(attempted []byte) []byte {
	if len(attempted) == 0 {
		return nil
	}
	if len(attempted) <= MaxBytes && json.Valid(attempted) && !bytes.Contains(attempted, []byte(`\u0000`)) {
		return attempted
	}
	s := attempted
	if len(s) > MaxBytes {
		s = s[:MaxBytes]
	}
	text := strings.ToValidUTF8(strings.ReplaceAll(string(s), "\x00", ""), string(utf8.RuneError))
	b, _ := json.Marshal(map[string]string{"body": text})
	return b
}
