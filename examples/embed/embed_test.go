package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/migrate"
)

// env is a variable's value, or def.
func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// services finds the Postgres server this test needs (in CI it must
// answer; elsewhere the test is skipped without it) and a NATS server: the
// one at HARVEST_NATS_URL when it answers, else one started here.
func services(t *testing.T) (adminURL, natsURL string) {
	t.Helper()
	adminURL = env("EMBED_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("Postgres (%s) must answer in CI: %v", adminURL, err)
		}
		t.Skipf("needs a Postgres server (EMBED_ADMIN_URL, default %s): %v", adminURL, err)
	}
	_ = conn.Close(ctx)

	natsURL = env("HARVEST_NATS_URL", "nats://127.0.0.1:4222")
	if nc, err := nats.Connect(natsURL); err == nil {
		nc.Close()
		return adminURL, natsURL
	}
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoSigs: true, NoLog: true})
	require.NoError(t, err)
	ns.Start()
	t.Cleanup(ns.Shutdown)
	require.True(t, ns.ReadyForConnections(10*time.Second), "the test's NATS server did not start")
	return adminURL, ns.ClientURL()
}

// freshDatabase creates an empty database and drops it at the end.
func freshDatabase(t *testing.T, adminURL string) string {
	t.Helper()
	ctx := context.Background()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "harvest_embed_" + hex.EncodeToString(b)
	conn, err := pgx.Connect(ctx, adminURL)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE DATABASE "+name)
	require.NoError(t, conn.Close(ctx))
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, adminURL)
		if err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			_ = c.Close(ctx)
		}
	})
	cfg, err := pgx.ParseConfig(adminURL)
	require.NoError(t, err)
	return fmt.Sprintf("postgres://%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, name)
}

// gateway builds the repository's gateway and runs it over the database,
// with one tenant token, until the test ends.
func gateway(t *testing.T, dbURL, natsURL string) (url, token string) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "gateway")
	// Built in the repository's own module, with its dependencies.
	build := exec.Command("go", "build", "-o", bin, "./cmd/gateway")
	build.Dir = filepath.Join("..", "..")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	b := make([]byte, 24)
	_, _ = rand.Read(b)
	token = "hv_" + hex.EncodeToString(b)
	sum := sha256.Sum256([]byte(token))
	tokens, err := json.Marshal([]map[string]any{{"name": "embed-example", "sha256": hex.EncodeToString(sum[:]),
		"tenant": "acme", "privileges": []string{"runs:start", "runs:read"}}})
	require.NoError(t, err)
	tokensFile := filepath.Join(dir, "tokens.json")
	require.NoError(t, os.WriteFile(tokensFile, tokens, 0o600))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "HARVEST_SHARDS="+dbURL, "HARVEST_NATS_URL="+natsURL,
		"HARVEST_GATEWAY_ADDR="+addr, "HARVEST_GATEWAY_TOKENS_FILE="+tokensFile)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	})
	url = "http://" + addr
	require.Eventually(t, func() bool {
		resp, err := http.Get(url + "/readyz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, time.Minute, 50*time.Millisecond, "the gateway did not become ready")
	return url, token
}

// An outside module migrates a fresh database with pkg/migrate, runs an
// embedded worker with its own handler, and completes a run it started
// through pkg/client.
func TestEmbeddedWorkerCompletesARun(t *testing.T) {
	adminURL, natsURL := services(t)
	dbURL := freshDatabase(t, adminURL)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	require.NoError(t, Migrate(ctx, dbURL))
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close()
	status, err := migrate.Status(ctx, pool)
	require.NoError(t, err)
	require.Len(t, status, migrate.Latest())
	for _, m := range status {
		require.True(t, m.Applied, "migration %d (%s) applied before any Harvest binary ran", m.Version, m.Name)
	}

	url, token := gateway(t, dbURL, natsURL)
	out, err := Greet(ctx, Settings{DatabaseURL: dbURL, NATSURL: natsURL, GatewayURL: url, Token: token}, "embedder")
	require.NoError(t, err)
	require.JSONEq(t, `{"greeting": "hello, embedder"}`, out)
}
