package api

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func ptr[T any](v T) *T { return &v }

func validStart() StartRequest {
	return StartRequest{Name: "echo", Queue: "shared", Input: json.RawMessage(`{"a":1}`)}
}

func TestStartValidateNamesTheField(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		edit  func(*StartRequest)
		field string
	}{
		{"missing name", func(r *StartRequest) { r.Name = "" }, "name"},
		{"blank name", func(r *StartRequest) { r.Name = "  " }, "name"},
		{"long name", func(r *StartRequest) { r.Name = strings.Repeat("n", 256) }, "name"},
		{"id with control char", func(r *StartRequest) { r.ID = "a\nb" }, "id"},
		{"missing queue", func(r *StartRequest) { r.Queue = "" }, "queue"},
		{"dot queue", func(r *StartRequest) { r.Queue = ".." }, "queue"},
		{"queue outer space", func(r *StartRequest) { r.Queue = " q" }, "queue"},
		{"empty fairness key", func(r *StartRequest) { r.FairnessKey = ptr("") }, "fairness_key"},
		{"long fairness key", func(r *StartRequest) { r.FairnessKey = ptr(strings.Repeat("k", 257)) }, "fairness_key"},
		{"empty quota key", func(r *StartRequest) { r.QuotaKey = ptr("") }, "quota_key"},
		{"long quota key", func(r *StartRequest) { r.QuotaKey = ptr(strings.Repeat("q", 257)) }, "quota_key"},
		{"quota key with NUL", func(r *StartRequest) { r.QuotaKey = ptr("a\x00") }, "quota_key"},
		{"priority high", func(r *StartRequest) { r.Priority = 1001 }, "priority"},
		{"priority low", func(r *StartRequest) { r.Priority = -1001 }, "priority"},
		{"run_at and delay", func(r *StartRequest) {
			r.RunAt = &Time{time.Now()}
			r.Delay = ptr(Duration(time.Second))
		}, "delay"},
		{"negative delay", func(r *StartRequest) { r.Delay = ptr(Duration(-time.Second)) }, "delay"},
		{"zero timeout", func(r *StartRequest) { r.Timeout = ptr(Duration(0)) }, "timeout"},
		{"max attempts zero", func(r *StartRequest) { r.MaxAttempts = ptr(0) }, "max_attempts"},
		{"bad input", func(r *StartRequest) { r.Input = json.RawMessage(`{`) }, "input"},
		{"deferred with fairness key", func(r *StartRequest) {
			r.FairnessKey = ptr("k")
			r.Throttle = json.RawMessage(`{"key":"t","limit":1,"period":"1s"}`)
		}, "fairness_key"},
	}
	for _, c := range cases {
		r := validStart()
		c.edit(&r)
		err := r.Validate()
		require.NotNil(t, err, c.name)
		require.Equal(t, c.field, err.Field, c.name)
		require.Equal(t, 400, err.Status, c.name)
		require.Equal(t, CodeInvalidArgument, err.Code, c.name)
		require.NotEmpty(t, err.Message, c.name)
	}
}

// A run's id and name refuse every bidirectional control, as keys do: with
// them one run could be drawn as another in the console, the CLI and logs.
func TestStartValidateRefusesBidiInIDAndName(t *testing.T) {
	t.Parallel()
	for _, c := range []rune{0x202A, 0x202B, 0x202C, 0x202D, 0x202E, 0x2066, 0x2067, 0x2068, 0x2069, 0x200E, 0x200F, 0x061C} {
		s := "invoice-" + string(c) + "fdp.exe"
		r := validStart()
		r.ID = s
		e := r.Validate()
		require.NotNil(t, e, "id with U+%04X", c)
		require.Equal(t, "id", e.Field)
		require.Contains(t, e.Message, "bidirectional", "id with U+%04X", c)
		r = validStart()
		r.Name = s
		e = r.Validate()
		require.NotNil(t, e, "name with U+%04X", c)
		require.Equal(t, "name", e.Field)
		require.Contains(t, e.Message, "bidirectional", "name with U+%04X", c)
	}
	// Other text beyond ASCII stays welcome.
	r := validStart()
	r.ID, r.Name = "заказ-42", "résumé ✓ 注文"
	require.Nil(t, r.Validate())
}

func TestStartValidateAcceptsGoodStarts(t *testing.T) {
	t.Parallel()
	r := validStart()
	require.Nil(t, r.Validate())
	r.FairnessKey, r.QuotaKey, r.Priority = ptr("tenant-42"), ptr("q"), 1000
	r.Delay, r.Timeout, r.MaxAttempts = ptr(Duration(0)), ptr(Duration(time.Second)), ptr(5)
	require.Nil(t, r.Validate())
	// A deferred start without a fairness key is fine.
	r = validStart()
	r.Debounce = json.RawMessage(`{}`)
	require.Nil(t, r.Validate())
}

func TestStartKeyResolution(t *testing.T) {
	t.Parallel()
	r := validStart()
	require.Equal(t, "", r.Key(), "neither key: the default key")
	r.QuotaKey = ptr("quota")
	require.Equal(t, "quota", r.Key(), "the quota key stands in")
	r.FairnessKey = ptr("fair")
	require.Equal(t, "fair", r.Key())
	// A quota key that is no valid fairness key is still a quota key, but
	// the run falls back to the default key.
	for _, qk := range []string{" spaced", ".", ".."} {
		r := validStart()
		r.QuotaKey = ptr(qk)
		require.Nil(t, r.Validate(), "quota key %q", qk)
		require.Equal(t, "", r.Key(), "quota key %q", qk)
	}
	// Control and bidirectional-control characters are refused in quota
	// keys too: they are printed wherever keys are.
	for _, qk := range []string{"a\x01b", "a\u202eb"} {
		r := validStart()
		r.QuotaKey = ptr(qk)
		require.NotNil(t, r.Validate(), "quota key %q", qk)
	}
}

func TestStartJSONFieldNames(t *testing.T) {
	t.Parallel()
	var r StartRequest
	body := `{"id":"r1","name":"echo","queue":"shared","input":[1],"fairness_key":"k","quota_key":"q",
		"priority":5,"delay":"1.5s","timeout":"250ms","max_attempts":4}`
	require.NoError(t, json.Unmarshal([]byte(body), &r))
	require.Equal(t, "r1", r.ID)
	require.Equal(t, Duration(1500*time.Millisecond), *r.Delay)
	require.Equal(t, Duration(250*time.Millisecond), *r.Timeout)
	require.Equal(t, 4, *r.MaxAttempts)
	require.Nil(t, r.Validate())

	require.Error(t, json.Unmarshal([]byte(`{"delay":"soon"}`), &r))
}

func TestRunTimesHaveMicroseconds(t *testing.T) {
	t.Parallel()
	ts := time.Date(2026, 11, 30, 5, 41, 0, 123456789, time.FixedZone("x", 3600))
	b, err := json.Marshal(Run{CreatedAt: Time{ts}, Status: StatusQueued})
	require.NoError(t, err)
	require.Contains(t, string(b), `"created_at":"2026-11-30T04:41:00.123456Z"`)
	require.Contains(t, string(b), `"claimed_at":null`)
}

func TestErrorCodesMatchStatuses(t *testing.T) {
	t.Parallel()
	want := map[Code]int{
		CodeInvalidArgument: 400, CodeUnauthenticated: 401, CodePermissionDenied: 403,
		CodeNotFound: 404, CodeConflict: 409, CodePayloadTooLarge: 413,
		CodeOverLimit: 429, CodeUnavailable: 503,
	}
	for c, s := range want {
		require.Equal(t, s, NewError(c, "x").Status)
	}
	b, err := json.Marshal(ErrorBody{Error: Invalid("fairness_key", "bad")})
	require.NoError(t, err)
	require.JSONEq(t, `{"error":{"status":400,"code":"invalid_argument","message":"bad","field":"fairness_key"}}`, string(b))
}
