package telemetry_test

import (
	"bytes"
	"context"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"

	"github.com/harvest-run/harvest/internal/telemetry"
)

// Not parallel: Setup installs process-wide providers.
func TestSetupTracesMetricsAndStoredContext(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	var spans bytes.Buffer
	shutdown, err := telemetry.Setup(context.Background(), "test-service", telemetry.WithStdout(&spans))
	require.NoError(t, err)

	counter, err := otel.Meter("test").Int64Counter("harvest.test.things")
	require.NoError(t, err)
	counter.Add(context.Background(), 3)
	rec := httptest.NewRecorder()
	telemetry.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	require.Contains(t, rec.Body.String(), "harvest_test_things_total")

	ctx, span := otel.Tracer("test").Start(context.Background(), "start")
	stored := telemetry.InjectJSON(ctx)
	span.End()
	require.NotEmpty(t, stored)
	sc := telemetry.SpanContextFromJSON(stored)
	require.True(t, sc.IsValid())
	require.Equal(t, span.SpanContext().TraceID(), sc.TraceID())
	require.False(t, telemetry.SpanContextFromJSON([]byte(`"nonsense"`)).IsValid())
	require.Nil(t, telemetry.InjectJSON(context.Background()))

	require.NoError(t, shutdown(context.Background()))
	require.Contains(t, spans.String(), `"Name":"start"`)
}
