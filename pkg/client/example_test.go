package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
)

// Start a run through a gateway and wait for its result. A start refused
// by admission is an *api.Error with code over_limit and a retry hint.
func ExampleClient_Start() {
	ctx := context.Background()
	c, err := client.New(client.Options{URL: os.Getenv("HARVEST_GATEWAY_URL"), Token: os.Getenv("HARVEST_TOKEN")})
	if err != nil {
		log.Fatal(err)
	}
	started, err := c.Start(ctx, "thumbnail", "images", map[string]string{"url": "https://example.com/a.png"},
		client.StartOptions{ID: "thumb-a", FairnessKey: "customer-42"})
	var ae *api.Error
	if errors.As(err, &ae) && ae.Code == api.CodeOverLimit {
		log.Printf("over the limit: retry in %d ms", ae.RetryAfterMS)
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	run, err := c.Wait(ctx, started.Run.ID, time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(run.Status, string(run.Output))
}

// Hear of a run's end on NATS instead of waiting for it. A run is
// announced only when its start asks (Notify); a tenant's NATS user may
// subscribe to its own runs' subject. The event is a hint: whoever must
// not miss the end also reads the run (Get) after a reconnect.
func ExampleStartOptions_notify() {
	ctx := context.Background()
	nc, err := nats.Connect(os.Getenv("HARVEST_NATS_URL"), nats.UserInfo("acme", os.Getenv("ACME_PASSWORD")),
		nats.CustomInboxPrefix("_INBOX_acme"))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("harvest.runs.acme.>")
	if err != nil {
		log.Fatal(err)
	}
	c, err := client.New(client.Options{NATS: nc, Tenant: "acme"})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.Start(ctx, "thumbnail", "images", nil, client.StartOptions{ID: "thumb-b", Notify: true}); err != nil {
		log.Fatal(err)
	}
	msg, err := sub.NextMsg(time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	var run api.Run
	if err := json.Unmarshal(msg.Data, &run); err != nil {
		log.Fatal(err)
	}
	fmt.Println(run.ID, run.Status)
}

// A client that retries refusals for overload and unavailability. The
// start below has no id: the client gives it one before the first attempt,
// so a retry after a lost answer returns the run that attempt made rather
// than starting a second.
func ExampleRetryPolicy() {
	c, err := client.New(client.Options{
		URL:   os.Getenv("HARVEST_GATEWAY_URL"),
		Token: os.Getenv("HARVEST_TOKEN"),
		Retry: &client.RetryPolicy{MaxAttempts: 5, MaxDelay: 10 * time.Second},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	started, err := c.Start(ctx, "thumbnail", "images", map[string]string{"url": "https://example.com/a.png"},
		client.StartOptions{})
	var ce *client.Error
	switch {
	case errors.Is(err, client.ErrOverLimit) && errors.As(err, &ce):
		log.Printf("still over the limit after the retries: come back in %s", ce.RetryAfter())
		return
	case errors.Is(err, client.ErrInvalid):
		log.Fatalf("the request is wrong, sending it again will not help: %v", err)
	case err != nil:
		log.Fatal(err)
	}
	fmt.Println(started.Run.ID, started.Created)
}

// New names the field of a policy it refuses.
func ExampleNew_retryPolicy() {
	_, err := client.New(client.Options{URL: "http://127.0.0.1:8080", Retry: &client.RetryPolicy{MaxAttempts: 0}})
	fmt.Println(err)
	// Output: client: Options.Retry.MaxAttempts must be at least 1, got 0
}
