package telemetry_test

import (
	"bytes"
	"context"
	"net/http/httptest"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/sdk/resource"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/harvest-run/harvest/internal/telemetry"
)

// noExportEnv empties every variable that would make Setup export.
func noExportEnv(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
		"OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER"} {
		t.Setenv(k, "")
	}
}

// Not parallel: Setup installs process-wide providers.
func TestSetupTracesMetricsAndStoredContext(t *testing.T) {
	noExportEnv(t)
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

// The environment names the service: OTEL_SERVICE_NAME wins over the
// binary's name, OTEL_RESOURCE_ATTRIBUTES adds attributes and may set the
// version, and every process has an instance id. Not parallel: t.Setenv.
func TestResourceEnvironmentWins(t *testing.T) {
	t.Setenv("OTEL_SERVICE_NAME", "billing-workers")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=staging,service.version=9.9.9")
	res, err := telemetry.Resource(context.Background(), "harvest-worker")
	require.NoError(t, err)
	attrs := resourceAttrs(res)
	require.Equal(t, "billing-workers", attrs["service.name"])
	require.Equal(t, "staging", attrs["deployment.environment.name"])
	require.Equal(t, "9.9.9", attrs["service.version"])
	_, err = uuid.Parse(attrs["service.instance.id"])
	require.NoError(t, err, "service.instance.id is not a UUID")
	require.Equal(t, "opentelemetry", attrs["telemetry.sdk.name"])
}

// Without OTEL_* variables the binary's name is the service name, the
// version comes from the build (a test binary has none) and the instance
// id stays the same for the whole process; an instance id set in the
// environment wins. Not parallel: t.Setenv.
func TestResourceDefaults(t *testing.T) {
	t.Setenv("OTEL_SERVICE_NAME", "")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "")
	res, err := telemetry.Resource(context.Background(), "harvest-gateway")
	require.NoError(t, err)
	attrs := resourceAttrs(res)
	require.Equal(t, "harvest-gateway", attrs["service.name"])
	require.NotEmpty(t, attrs["service.version"])
	again, err := telemetry.Resource(context.Background(), "harvest-gateway")
	require.NoError(t, err)
	require.Equal(t, attrs["service.instance.id"], resourceAttrs(again)["service.instance.id"])

	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "service.instance.id=pod-7")
	res, err = telemetry.Resource(context.Background(), "harvest-gateway")
	require.NoError(t, err)
	require.Equal(t, "pod-7", resourceAttrs(res)["service.instance.id"])
}

// Setup puts the resource on the spans: the service name from the
// environment, not the one the binary passes. OTEL_TRACES_EXPORTER=none
// goes through autoexport and exports nothing. Not parallel: Setup
// installs process-wide providers, and t.Setenv.
func TestSetupUsesEnvironmentServiceName(t *testing.T) {
	t.Setenv("OTEL_SERVICE_NAME", "from-env")
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	t.Setenv("OTEL_METRICS_EXPORTER", "none")
	rec := tracetest.NewSpanRecorder()
	shutdown, err := telemetry.Setup(context.Background(), "harvest-worker", telemetry.WithSpanProcessor(rec))
	require.NoError(t, err)
	_, span := otel.Tracer("test").Start(context.Background(), "op")
	span.End()
	require.NoError(t, shutdown(context.Background()))
	require.Len(t, rec.Ended(), 1)
	attrs := resourceAttrs(rec.Ended()[0].Resource())
	require.Equal(t, "from-env", attrs["service.name"])
	require.NotEmpty(t, attrs["service.instance.id"])
}

// An unknown exporter name is an error of Setup, not a silent loss of the
// traces or metrics. Not parallel: t.Setenv.
func TestSetupRejectsUnknownExporter(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "carrier-pigeon")
	_, err := telemetry.Setup(context.Background(), "harvest-worker")
	require.ErrorContains(t, err, "telemetry: trace exporter")

	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	t.Setenv("OTEL_METRICS_EXPORTER", "carrier-pigeon")
	_, err = telemetry.Setup(context.Background(), "harvest-worker")
	require.ErrorContains(t, err, "telemetry: metric exporter")
}

func resourceAttrs(res *resource.Resource) map[string]string {
	m := map[string]string{}
	for _, kv := range res.Attributes() {
		m[string(kv.Key)] = kv.Value.String()
	}
	return m
}
