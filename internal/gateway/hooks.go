package gateway

import (
	"context"

	"github.com/harvest-run/harvest/pkg/api"
)

// Transports a start can arrive on.
const (
	TransportHTTP = "http"
	TransportNATS = "nats"
)

// StartAuthorization is what an Authorizer sees of one start.
type StartAuthorization struct {
	// Transport is TransportHTTP or TransportNATS.
	Transport string
	// Tenant is the tenant the run is started for.
	Tenant string
	// Principal is the bearer token's name over HTTP; empty over NATS,
	// where the NATS user is known only to the server.
	Principal string
	// Request is the start as it will be written: validated, with its id
	// and, under key binding, its bound fairness key. The hook must not
	// change it.
	Request *api.StartRequest
}

// Authorizer is a hook called on every start (each item of a batch too),
// before anything is written. Returning an error refuses that start: an
// *api.Error reaches the caller as it is, any other error becomes 403
// permission_denied with its text as the message.
type Authorizer interface {
	AuthorizeStart(ctx context.Context, s StartAuthorization) error
}

// AuthorizerFunc adapts a function to Authorizer.
type AuthorizerFunc func(ctx context.Context, s StartAuthorization) error

// AuthorizeStart calls f.
func (f AuthorizerFunc) AuthorizeStart(ctx context.Context, s StartAuthorization) error {
	return f(ctx, s)
}
