package api

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTimeMarshalsAsUTCString(t *testing.T) {
	t.Parallel()
	east := time.FixedZone("east", 5*3600+30*60)
	for _, tc := range []struct {
		in   time.Time
		want string
	}{
		{time.Date(2026, 12, 5, 17, 4, 5, 123456789, time.UTC), `"2026-12-05T17:04:05.123456Z"`},
		{time.Date(2026, 12, 5, 1, 0, 0, 0, east), `"2026-12-04T19:30:00.000000Z"`},
		{time.Time{}, `"0001-01-01T00:00:00.000000Z"`},
	} {
		got, err := json.Marshal(Time{tc.in})
		require.NoError(t, err)
		require.Equal(t, tc.want, string(got))

		var back Time
		require.NoError(t, json.Unmarshal(got, &back))
		require.True(t, back.Equal(tc.in.Truncate(time.Microsecond)), "%s read back as %s", tc.in, back)
	}
}

func BenchmarkRunMarshal(b *testing.B) {
	now := time.Now()
	r := Run{ID: "run-000001", Tenant: "acme", Name: "echo", Queue: "default", Status: StatusCompleted,
		CreatedAt: Time{now}, ClaimedAt: &Time{now}, FinishedAt: &Time{now}, Output: json.RawMessage(`{"ok":true}`)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := json.Marshal(r); err != nil {
			b.Fatal(err)
		}
	}
}
