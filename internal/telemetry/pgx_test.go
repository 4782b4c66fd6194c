package telemetry_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/harvest-run/harvest/internal/telemetry"
	"github.com/harvest-run/harvest/internal/testsvc"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

// A pool configured by PoolConfig traces statements made inside a span,
// without their SQL text or parameters, and makes no span for statements
// made outside any span. Not parallel: it installs the process's providers.
func TestPoolConfigTracesChildStatementsWithoutSQL(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	shutdown, err := telemetry.Shared(context.Background(), "pgx-test", telemetry.WithSpanProcessor(rec))
	require.NoError(t, err)
	defer func() { require.NoError(t, shutdown(context.Background())) }()
	// While Shared is in force, Setup keeps its providers.
	noop, err := telemetry.Setup(context.Background(), "other")
	require.NoError(t, err)
	require.NoError(t, noop(context.Background()))

	cfg, err := pgxpool.ParseConfig(testsvc.NewDBURL(t))
	require.NoError(t, err)
	telemetry.PoolConfig(cfg)
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()

	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT 41 + $1::int", 1).Scan(&n))
	require.Empty(t, rec.Ended(), "a statement outside any span made a span")

	ctx2, parent := otelTracer().Start(ctx, "parent")
	require.NoError(t, pool.QueryRow(ctx2, "SELECT 'secret-value', $1::int", 2).Scan(new(string), &n))
	parent.End()
	var db int
	for _, s := range rec.Ended() {
		for _, kv := range s.Attributes() {
			require.NotContains(t, []string{"db.query.text", "db.statement", "pgx.query.parameters"}, string(kv.Key))
			require.NotContains(t, kv.Value.String(), "secret-value")
		}
		if s.Name() == "SELECT" {
			db++
			require.Equal(t, parent.SpanContext().TraceID(), s.SpanContext().TraceID())
		}
	}
	require.Positive(t, db)
}

func otelTracer() trace.Tracer { return otel.Tracer("pgx-test") }
