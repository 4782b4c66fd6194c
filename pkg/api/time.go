package api

import (
	"encoding/json"
	"fmt"
	"time"
)

// TimeLayout is RFC 3339 with exactly six fractional digits: the database
// clock's resolution, so a time read back compares equal to the one written.
const TimeLayout = "2006-01-02T15:04:05.000000Z07:00"

// Time is a timestamp that marshals with TimeLayout in UTC.
type Time struct{ time.Time }

// MarshalJSON writes the time in TimeLayout, UTC, as a JSON string. The
// layout's output never needs escaping, so the quotes are appended around
// it directly: a worker encodes two or three of these in every run event
// it sends, and going through json.Marshal for each was about a third of
// the event's encoding (BenchmarkRunMarshal).
func (t Time) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, len(TimeLayout)+2)
	b = append(b, '"')
	b = t.UTC().AppendFormat(b, TimeLayout)
	return append(b, '"'), nil
}

// UnmarshalJSON accepts any RFC 3339 time.
func (t *Time) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want an RFC 3339 time string")
	}
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return fmt.Errorf("want an RFC 3339 time, got %q", s)
	}
	t.Time = v
	return nil
}

// Duration is a Go duration string on the wire ("250ms", "1.5s").
type Duration time.Duration

// MarshalJSON writes the duration as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON parses a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf(`want a duration string such as "250ms" or "1.5s"`)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration such as \"250ms\" or \"1.5s\", got %q", s)
	}
	*d = Duration(v)
	return nil
}
