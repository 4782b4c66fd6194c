// Package auditdoc bounds what an audit row keeps of a refused request, for
// every writer of refused rows (pkg/weights.AuditRefused is the one that
// stores them). Whatever a caller sends, the row it leaves is small: each
// text and each JSON document is capped in bytes, cut on a character
// boundary with Marker at the end, and made into something Postgres can
// store (valid UTF-8, no NUL), so that a refusal can neither bloat the log
// nor escape it by failing to insert.
package auditdoc

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"
)

const (
	// MaxBytes bounds a JSON document an audit row keeps of a refused
	// request: what the caller sent, and the setting then in force.
	MaxBytes = 4096
	// MaxTextBytes bounds each text of a refused row: the message, the
	// queue and the key (path values a caller chooses, up to the size of
	// a request's headers), and the actor.
	MaxTextBytes = 1024
	// Marker ends a text or a body that was cut to fit.
	Marker = "…[truncated]"
)

// Text is s as an audit row stores it: invalid UTF-8 replaced by U+FFFD,
// NUL bytes dropped (a text column cannot hold them), and, when longer
// than maxBytes, cut on a character boundary with Marker at the end, so
// that the result is at most maxBytes long.
func Text(s string, maxBytes int) string {
	s = clean(s)
	if len(s) <= maxBytes {
		return s
	}
	if maxBytes < len(Marker) {
		return cut(s, maxBytes)
	}
	return cut(s, maxBytes-len(Marker)) + Marker
}

// Value is a JSON document (what a caller sent, or the setting then in
// force) as a jsonb value an audit row can keep, at most MaxBytes long:
// the document itself when it is valid JSON of at most MaxBytes that
// Postgres can store; otherwise {"body": "<text>"}, the bytes as text
// (see Text), cut to fit with Marker when they do not; nil for nothing
// sent. A caller that kept only the first bytes of a longer body should
// pass MaxBytes+1 of them, so that the cut shows.
func Value(doc []byte) []byte {
	if len(doc) == 0 {
		return nil
	}
	if len(doc) <= MaxBytes && json.Valid(doc) && !bytes.Contains(doc, []byte(`\u0000`)) {
		return doc
	}
	text := clean(string(doc))
	keep := len(text)
	for {
		t := text
		if keep < len(text) {
			t = cut(text, keep) + Marker
		}
		b, _ := json.Marshal(map[string]string{"body": t})
		if len(b) <= MaxBytes {
			return b
		}
		// Each byte of text takes at least one byte in the document
		// (JSON escapes are longer than what they escape), so dropping
		// the excess from the text brings the document under the bound
		// once the marker is in: at most two more rounds.
		keep = max(0, len(cut(text, keep))-(len(b)-MaxBytes))
	}
}

// clean makes s storable as text: valid UTF-8, no NUL.
func clean(s string) string {
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), string(utf8.RuneError))
}

// cut is the longest prefix of s of at most n bytes that ends on a
// character boundary.
func cut(s string, n int) string {
	if n >= len(s) {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
