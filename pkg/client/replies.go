package client

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
)

// inboxPrefix is the reply-inbox prefix of a tenant's NATS clients. The
// gateways answer a start only on a subject under it (anything else would
// let a tenant have the gateway publish, with its own rights, into another
// tenant's inbox), and the shipped NATS permissions let a tenant's user
// subscribe there and nowhere else.
func inboxPrefix(tenant string) string { return "_INBOX_" + tenant }

// replies receives the answers of a client whose connection's own inbox
// prefix is not the tenant's (a service connection shared by several
// tenants' clients, say): one subscription under the tenant's inbox, and
// each request waits on its own token below it, as nats.go's own request
// multiplexer does for the connection's prefix.
type replies struct {
	next atomic.Uint64

	mu      sync.Mutex
	prefix  string // <tenant inbox>.<nuid>.; "" until subscribed
	waiting map[string]chan *nats.Msg
}

// subscribe makes the subscription under the tenant's inbox the first time
// it is needed. A failed attempt is tried again by the next request, not
// kept: a connection that was briefly down must not break the client for
// good.
func (r *replies) subscribe(ctx context.Context, nc *nats.Conn, tenant string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.prefix != "" {
		return r.prefix, nil
	}
	prefix := inboxPrefix(tenant) + "." + nuid.Next() + "."
	sub, err := nc.Subscribe(prefix+"*", func(m *nats.Msg) {
		r.mu.Lock()
		ch := r.waiting[strings.TrimPrefix(m.Subject, prefix)]
		r.mu.Unlock()
		if ch != nil {
			select {
			case ch <- m:
			default: // a second answer to one request is dropped
			}
		}
	})
	if err != nil {
		return "", err
	}
	// The server must know the subscription before an answer can come
	// back on it.
	if err := nc.FlushWithContext(ctx); err != nil {
		_ = sub.Unsubscribe()
		return "", err
	}
	r.prefix, r.waiting = prefix, map[string]chan *nats.Msg{}
	return prefix, nil
}

// request publishes msg with a reply subject under the tenant's inbox and
// waits for the answer.
func (r *replies) request(ctx context.Context, nc *nats.Conn, tenant string, msg *nats.Msg) (*nats.Msg, error) {
	prefix, err := r.subscribe(ctx, nc, tenant)
	if err != nil {
		return nil, err
	}
	token := strconv.FormatUint(r.next.Add(1), 36)
	ch := make(chan *nats.Msg, 1)
	r.mu.Lock()
	r.waiting[token] = ch
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.waiting, token)
		r.mu.Unlock()
	}()
	msg.Reply = prefix + token
	if err := nc.PublishMsg(msg); err != nil {
		return nil, err
	}
	select {
	case m := <-ch:
		// The server's no-responders notice: status 503, no body.
		if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
			return nil, nats.ErrNoResponders
		}
		return m, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
