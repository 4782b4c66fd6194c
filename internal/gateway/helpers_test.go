package gateway

import (
	"time"

	"github.com/nats-io/nats.go"

	"github.com/harvest-run/harvest/pkg/client"
)

func clientOpts(id, key string) client.StartOptions {
	return client.StartOptions{ID: id, FairnessKey: key}
}

func clientDelay(d time.Duration) client.StartOptions { return client.StartOptions{Delay: d} }

type natsMsg = nats.Msg
