package api

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseDeferNamesTheField(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		edit  func(*StartRequest)
		field string
	}{
		{"none", func(r *StartRequest) {}, "throttle"},
		{"two modes", func(r *StartRequest) {
			r.Throttle = json.RawMessage(`{"limit":1,"period":"1s"}`)
			r.Batch = json.RawMessage(`{"max_size":2,"max_wait":"1s"}`)
		}, "batch"},
		{"fairness key", func(r *StartRequest) {
			r.Debounce = json.RawMessage(`{"period":"1s"}`)
			r.FairnessKey = ptr("k")
		}, "fairness_key"},
		{"delay", func(r *StartRequest) {
			r.Debounce = json.RawMessage(`{"period":"1s"}`)
			r.Delay = ptr(Duration(time.Second))
		}, "delay"},
		{"not an object", func(r *StartRequest) { r.Throttle = json.RawMessage(`[1]`) }, "throttle"},
		{"unknown field", func(r *StartRequest) { r.Throttle = json.RawMessage(`{"limit":1,"period":"1s","burst":2}`) }, "throttle.burst"},
		{"limit zero", func(r *StartRequest) { r.Throttle = json.RawMessage(`{"period":"1s"}`) }, "throttle.limit"},
		{"limit type", func(r *StartRequest) { r.Throttle = json.RawMessage(`{"limit":"1","period":"1s"}`) }, "throttle.limit"},
		{"period missing", func(r *StartRequest) { r.Throttle = json.RawMessage(`{"limit":1}`) }, "throttle.period"},
		{"period text", func(r *StartRequest) { r.Throttle = json.RawMessage(`{"limit":1,"period":"soon"}`) }, "throttle.period"},
		{"bad key", func(r *StartRequest) { r.Throttle = json.RawMessage(`{"key":" k","limit":1,"period":"1s"}`) }, "throttle.key"},
		{"debounce period", func(r *StartRequest) { r.Debounce = json.RawMessage(`{"period":"-1s"}`) }, "debounce.period"},
		{"debounce long", func(r *StartRequest) { r.Debounce = json.RawMessage(`{"period":"200h"}`) }, "debounce.period"},
		{"max_wait short", func(r *StartRequest) { r.Debounce = json.RawMessage(`{"period":"10s","max_wait":"5s"}`) }, "debounce.max_wait"},
		{"batch size", func(r *StartRequest) { r.Batch = json.RawMessage(`{"max_size":1001,"max_wait":"1s"}`) }, "batch.max_size"},
		{"batch wait", func(r *StartRequest) { r.Batch = json.RawMessage(`{"max_size":2}`) }, "batch.max_wait"},
	}
	for _, c := range cases {
		r := validStart()
		c.edit(&r)
		_, err := r.ParseDefer()
		require.NotNil(t, err, c.name)
		require.Equal(t, c.field, err.Field, c.name)
		require.Equal(t, 400, err.Status, c.name)
	}
}

func TestParseDeferReadsEachMode(t *testing.T) {
	t.Parallel()
	r := validStart()
	r.Throttle = json.RawMessage(`{"key":"k","limit":3,"period":"1m"}`)
	d, err := r.ParseDefer()
	require.Nil(t, err)
	require.Equal(t, ModeThrottle, d.Mode)
	require.Equal(t, ThrottleSpec{Key: "k", Limit: 3, Period: Duration(time.Minute)}, *d.Throttle)
	require.Equal(t, "k", d.Key())

	r = validStart()
	r.Debounce = json.RawMessage(`{"period":"1s"}`)
	d, err = r.ParseDefer()
	require.Nil(t, err)
	require.Equal(t, ModeDebounce, d.Mode)
	require.Nil(t, d.Debounce.MaxWait)
	require.Equal(t, "", d.Key(), "no key: the default key")

	r = validStart()
	r.Batch = json.RawMessage(`{"key":"b","max_size":10,"max_wait":"2s"}`)
	d, err = r.ParseDefer()
	require.Nil(t, err)
	require.Equal(t, BatchSpec{Key: "b", MaxSize: 10, MaxWait: Duration(2 * time.Second)}, *d.Batch)
}

func TestRunDeferredFieldsAreOptional(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(Run{Status: StatusQueued})
	require.NoError(t, err)
	require.NotContains(t, string(b), "fires_at")
	require.NotContains(t, string(b), "run_id")
	ts := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	b, err = json.Marshal(Run{Status: StatusDeferred, FiresAt: &Time{ts}, RunID: "r", DeferMode: ModeBatch})
	require.NoError(t, err)
	require.Contains(t, string(b), `"fires_at":"2030-01-01T00:00:00.000000Z","run_id":"r","defer_mode":"batch"`)
}
