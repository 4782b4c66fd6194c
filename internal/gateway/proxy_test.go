package gateway

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// shardProxy forwards TCP connections to a Postgres server and can be
// switched off (the shard "dies": connections drop, new ones are refused)
// and on again on the same port (the shard "comes back").
type shardProxy struct {
	t      *testing.T
	target string // host:port of the real server
	addr   string // host:port the proxy listens on

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// newShardProxy proxies the database of dbURL and returns the proxy and
// the URL to give the gateway.
func newShardProxy(t *testing.T, dbURL string) (*shardProxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	p := &shardProxy{t: t, target: u.Host, conns: map[net.Conn]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.down)
	u.Host = p.addr
	q := u.Query()
	q.Set("connect_timeout", "1")
	u.RawQuery = q.Encode()
	return p, u.String()
}

func (p *shardProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.ln != ln {
				// down ran meanwhile: it would never see this pair.
				p.mu.Unlock()
				c.Close()
				up.Close()
				return
			}
			p.conns[c], p.conns[up] = true, true
			p.mu.Unlock()
			p.wg.Go(func() { _, _ = io.Copy(up, c); up.Close(); c.Close() })
			p.wg.Go(func() { _, _ = io.Copy(c, up); up.Close(); c.Close() })
		}
	})
}

// down closes the listener and every connection.
func (p *shardProxy) down() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]bool{}
	p.mu.Unlock()
	p.wg.Wait()
}

// up listens again on the same address.
func (p *shardProxy) up() {
	ln, err := net.Listen("tcp", p.addr)
	require.NoError(p.t, err)
	p.serve(ln)
}
