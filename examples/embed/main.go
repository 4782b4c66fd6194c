// Command embed is a Go service outside the Harvest module that embeds a
// Harvest worker: it creates the schema of its shard with pkg/migrate,
// serves the workflow "greet" with its own handler, and starts a run of it
// through a gateway with pkg/client, then waits for the result.
//
//	EMBED_DATABASE_URL=postgres://... HARVEST_NATS_URL=nats://... \
//	HARVEST_GATEWAY_URL=http://... HARVEST_TOKEN=... go run .
//
// The gateway must route the token's tenant to the same database (one
// shard, HARVEST_SHARDS). embed_test.go runs all of it against a gateway
// binary built from this repository.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/harvest-run/harvest/pkg/client"
	"github.com/harvest-run/harvest/pkg/migrate"
	"github.com/harvest-run/harvest/pkg/worker"
)

// Settings are where the service finds its shard, NATS and a gateway.
type Settings struct {
	DatabaseURL string // the shard's database
	NATSURL     string
	GatewayURL  string
	Token       string // a tenant token with runs:start and runs:read
}

func main() {
	s := Settings{DatabaseURL: os.Getenv("EMBED_DATABASE_URL"), NATSURL: os.Getenv("HARVEST_NATS_URL"),
		GatewayURL: os.Getenv("HARVEST_GATEWAY_URL"), Token: os.Getenv("HARVEST_TOKEN")}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := Migrate(ctx, s.DatabaseURL); err != nil {
		log.Fatal(err)
	}
	out, err := Greet(ctx, s, "world")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(out)
}

// Migrate brings the shard's schema up to date.
func Migrate(ctx context.Context, databaseURL string) error {
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return fmt.Errorf("embed: %w", err)
	}
	defer pool.Close()
	if err := migrate.Up(ctx, pool); err != nil {
		return fmt.Errorf("embed: migrate: %w", err)
	}
	return nil
}

// Greet runs an embedded worker serving "greet", starts one run of it for
// name through the gateway, and returns the run's output once it is done.
func Greet(ctx context.Context, s Settings, name string) (string, error) {
	pool, err := pgxpool.New(ctx, s.DatabaseURL)
	if err != nil {
		return "", fmt.Errorf("embed: %w", err)
	}
	defer pool.Close()
	nc, err := nats.Connect(s.NATSURL)
	if err != nil {
		return "", fmt.Errorf("embed: NATS: %w", err)
	}
	defer nc.Close()

	cfg := worker.DefaultConfig()
	cfg.Queues = map[string]float64{"greetings": 1}
	cfg.ShutdownGrace = time.Second
	w, err := worker.New(pool, cfg, worker.Options{NATS: nc})
	if err != nil {
		return "", fmt.Errorf("embed: %w", err)
	}
	w.HandleFunc("greet", func(_ context.Context, t worker.Task) (worker.Result, error) {
		var in struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(t.Input, &in); err != nil {
			return worker.Result{}, worker.Permanent(err)
		}
		out, err := json.Marshal(map[string]string{"greeting": "hello, " + in.Name})
		if err != nil {
			return worker.Result{}, err
		}
		return worker.Complete(out), nil
	})
	wctx, stopWorker := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() {
		stopWorker()
		<-done
	}()

	c, err := client.New(client.Options{URL: s.GatewayURL, Token: s.Token})
	if err != nil {
		return "", fmt.Errorf("embed: %w", err)
	}
	started, err := c.Start(ctx, "greet", "greetings", map[string]string{"name": name}, client.StartOptions{})
	if err != nil {
		return "", fmt.Errorf("embed: start: %w", err)
	}
	run, err := c.Wait(ctx, started.Run.ID, time.Minute)
	if err != nil {
		return "", fmt.Errorf("embed: wait: %w", err)
	}
	if run.Status != "completed" {
		return "", errors.New("embed: the run ended " + string(run.Status))
	}
	return string(run.Output), nil
}
