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
	once   sync.Once
	err    error
	prefix string // <tenant inbox>.<nuid>.
	next   atomic.Uint64

	mu      sync.Mutex
	waiting map[string]chan *nats.Msg
}

// request publishes msg with a reply subject under the tenant's inbox and
// waits for the answer.
func (r *replies) request(ctx context.Context, nc *nats.Conn, tenant string, msg *nats.Msg) (*nats.Msg, error) {
	r.once.Do(func() {
		r.prefix = inboxPrefix(tenant) + "." + nuid.Next() + "."
		r.waiting = map[string]chan *nats.Msg{}
		_, r.err = nc.Subscribe(r.prefix+"*", func(m *nats.Msg) {
			r.mu.Lock()
			ch := r.waiting[strings.TrimPrefix(m.Subject, r.prefix)]
			r.mu.Unlock()
			if ch != nil {
				select {
				case ch <- m:
				default: // a second answer to one request is dropped
				}
			}
		})
		if r.err == nil {
			// The server must know the subscription before an answer can
			// come back on it.
			r.err = nc.FlushWithContext(ctx)
		}
	})
	if r.err != nil {
		return nil, r.err
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
	msg.Reply = r.prefix + token
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
