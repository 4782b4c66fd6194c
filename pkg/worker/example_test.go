package worker_test

import (
	"context"
	"encoding/json"
	"log"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/harvest-run/harvest/pkg/migrate"
	"github.com/harvest-run/harvest/pkg/worker"
)

// Embed a worker in a service: migrate its shard, register a handler, run
// until the process is told to stop (the running tasks then get
// ShutdownGrace to finish).
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("SHARD_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := migrate.Up(ctx, pool); err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(os.Getenv("NATS_URL"), nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	cfg := worker.DefaultConfig()
	cfg.Queues = map[string]float64{"images": 1}
	cfg.FairnessKeys = true
	w, err := worker.New(pool, cfg, worker.Options{NATS: nc})
	if err != nil {
		log.Fatal(err) // a *worker.ConfigError names the field at fault
	}
	w.HandleFunc("thumbnail", func(ctx context.Context, t worker.Task) (worker.Result, error) {
		var in struct {
			URL string `json:"url"`
		}
		if err := json.Unmarshal(t.Input, &in); err != nil {
			return worker.Result{}, worker.Permanent(err) // fail the run, no retry
		}
		out, err := json.Marshal(map[string]string{"thumbnail": in.URL + "?w=128"})
		if err != nil {
			return worker.Result{}, err // retried with backoff
		}
		return worker.Complete(out), nil
	})
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
