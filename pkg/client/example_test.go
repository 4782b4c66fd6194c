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
