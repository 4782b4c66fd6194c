package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

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
