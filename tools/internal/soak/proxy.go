package soak

import (
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy is a TCP proxy in front of one Postgres server. It forwards bytes
// as they come, and on demand delays each new connection and each chunk,
// cuts every open connection, or refuses new ones (accepts and closes them
// at once, as a stopped server's port would refuse them).
type Proxy struct {
	target string
	ln     net.Listener

	mu     sync.Mutex
	delay  time.Duration
	refuse bool
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup

	Accepted int64 // connections accepted (under mu)
	Cut      int64 // connections closed by Cut (under mu)

	// statements counts the statements clients sent through the proxy,
	// uncounted the connections whose stream could not be read (TLS);
	// kinds counts them again by what they do (stmtKind).
	statements, uncounted atomic.Int64
	kinds                 [numKinds]atomic.Int64
}

// stmtKind is what a statement does, read from the SQL it executes: the
// mix's report counts the claim, outcome and start statements per run.
type stmtKind int

const (
	kindOther stmtKind = iota
	kindClaim
	kindOutcome
	kindStart
	kindHeartbeat
	kindTx       // BEGIN, COMMIT, ROLLBACK
	kindWALFlush // the wait for a claim's or a start group's WAL flush
	numKinds
)

// kindMarks are the markers of each kind in a statement's text, first
// match wins (the WAL flush statements name no Harvest function).
var kindMarks = []struct {
	mark string
	kind stmtKind
}{
	{"harvest_claim_batch(", kindClaim},
	{"harvest_claim(", kindClaim},
	{"harvest_outcome_batch(", kindOutcome},
	{"harvest_start_group(", kindStart},
	{"harvest_heartbeat", kindHeartbeat},
	{"pg_logical_emit_message", kindWALFlush},
}

// kindOf classifies a statement's text.
func kindOf(sql string) stmtKind {
	for _, m := range kindMarks {
		if strings.Contains(sql, m.mark) {
			return m.kind
		}
	}
	switch strings.ToUpper(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(sql), ";"))) {
	case "BEGIN", "COMMIT", "ROLLBACK":
		return kindTx
	}
	return kindOther
}

// NewProxy listens on a free port of 127.0.0.1 and forwards to target
// (host:port).
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetDelay delays the start of every new connection and every forwarded
// chunk by d (0: none).
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// SetRefuse makes the proxy close new connections at once (true) or
// forward them again (false).
func (p *Proxy) SetRefuse(on bool) {
	p.mu.Lock()
	p.refuse = on
	p.mu.Unlock()
}

// CutAll closes every open connection, in both directions, and returns
// how many there were.
func (p *Proxy) CutAll() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
		n++
	}
	p.Cut += int64(n)
	return n
}

// Close stops listening, cuts every connection and waits for the
// forwarding goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.CutAll()
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) settings() (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay, p.refuse
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.mu.Lock()
		p.Accepted++
		p.mu.Unlock()
		if _, refuse := p.settings(); refuse {
			_ = c.Close()
			continue
		}
		p.wg.Add(1)
		go p.forward(c)
	}
}

func (p *Proxy) forward(client net.Conn) {
	defer p.wg.Done()
	if !p.track(client) {
		return
	}
	defer p.untrack(client)
	if d, _ := p.settings(); d > 0 {
		time.Sleep(d)
	}
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return
	}
	if !p.track(server) {
		return
	}
	defer p.untrack(server)
	var once sync.WaitGroup
	once.Add(2)
	pipe := func(dst, src net.Conn, count *statementCounter) {
		defer once.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if d, _ := p.settings(); d > 0 {
					time.Sleep(d)
				}
				if count != nil {
					count.feed(buf[:n])
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		// Either side ending ends both: Postgres has no half-close.
		_ = dst.Close()
		_ = src.Close()
	}
	count := &statementCounter{statements: &p.statements, uncounted: &p.uncounted, kinds: &p.kinds, startup: true}
	go pipe(server, client, count)
	pipe(client, server, nil)
	once.Wait()
}

// Statements returns the statements clients have sent through the proxy
// (extended-protocol Execute and simple Query messages) and the
// connections it could not count (encrypted: their statements are not in
// the first figure).
func (p *Proxy) Statements() (statements, uncounted int64) {
	return p.statements.Load(), p.uncounted.Load()
}

// Kinds returns the statements counted so far by kind.
func (p *Proxy) Kinds() [numKinds]int64 {
	var out [numKinds]int64
	for i := range out {
		out[i] = p.kinds[i].Load()
	}
	return out
}

// Frontend protocol codes of the untyped messages that may open a
// connection (PostgreSQL protocol 3.0): after an SSL or GSSAPI encryption
// request the client sends another untyped message, a startup packet or
// (when the server agreed) its TLS handshake.
const (
	pgSSLRequest    = 80877103
	pgGSSENCRequest = 80877104
	pgCancelRequest = 80877102
	pgProtocol3     = 196608
)

// statementCounter reads the client's side of one Postgres connection as
// it passes and counts its statements: each Execute ('E') of the extended
// protocol and each simple Query ('Q'). It keeps the message framing (a
// type byte and a length) and, to tell the statements' kinds (kinds, when
// set), the text of each Parse and simple Query and the start of each Bind
// (the statement it binds): an Execute is of the kind of the statement its
// Bind named. A stream it cannot frame (TLS after an SSLRequest the server
// accepted) stops the count for that connection and is reported as
// uncounted.
type statementCounter struct {
	statements, uncounted *atomic.Int64
	kinds                 *[numKinds]atomic.Int64

	startup bool    // the next message is untyped (no type byte)
	hdr     [8]byte // the header read so far: type and length, or length and code
	hdrN    int
	need    int // bytes of the current message's body still to skip
	off     bool

	typ      byte                // the type of the message whose body is read
	body     []byte              // its body so far (at most maxKeep bytes), when kept
	keep     bool                // whether the body is kept
	prepared map[string]stmtKind // statement name -> kind, from its Parse
	bound    stmtKind            // the kind the last Bind named
}

// maxKeep is the most of a Parse's or a Query's body the counter keeps
// (every statement's text the mix sends fits), maxKeepBind of a Bind's:
// its portal's and statement's names come first, before its parameters
// (a start group's arrays run to kilobytes), and pgx names a statement
// in under 60 bytes.
const (
	maxKeep     = 16 << 10
	maxKeepBind = 256
)

func (c *statementCounter) feed(b []byte) {
	for len(b) > 0 && !c.off {
		if c.need > 0 {
			k := min(c.need, len(b))
			if limit := c.keepLimit(); c.keep && len(c.body) < limit {
				c.body = append(c.body, b[:min(k, limit-len(c.body))]...)
			}
			c.need -= k
			b = b[k:]
			if c.need == 0 && c.keep {
				c.kept()
			}
			continue
		}
		// An untyped message starts with its length and a code, a typed
		// one with its type and its length.
		size := 5
		if c.startup {
			size = 8
		}
		k := copy(c.hdr[c.hdrN:size], b)
		c.hdrN += k
		b = b[k:]
		if c.hdrN < size {
			return
		}
		c.hdrN = 0
		if c.startup {
			n := int(binary.BigEndian.Uint32(c.hdr[0:4]))
			code := binary.BigEndian.Uint32(c.hdr[4:8])
			// A startup packet is a few hundred bytes at most: a longer
			// one is a TLS record read as a length.
			known := code == pgProtocol3 || code == pgSSLRequest || code == pgGSSENCRequest || code == pgCancelRequest
			if n < 8 || n > 1<<16 || !known {
				c.stop()
				return
			}
			c.need = n - 8
			c.startup = code == pgSSLRequest || code == pgGSSENCRequest
			continue
		}
		n := int(binary.BigEndian.Uint32(c.hdr[1:5]))
		if n < 4 {
			c.stop()
			return
		}
		c.need = n - 4
		t := c.hdr[0]
		if t == 'E' || t == 'Q' {
			c.statements.Add(1)
		}
		if c.kinds == nil {
			continue
		}
		if t == 'E' {
			c.kinds[c.bound].Add(1)
		}
		if t == 'P' || t == 'B' || t == 'Q' {
			c.typ, c.body, c.keep = t, c.body[:0], true
			if c.need == 0 {
				c.kept()
			}
		}
	}
}

// keepLimit is how much of the current message's body is kept.
func (c *statementCounter) keepLimit() int {
	if c.typ == 'B' {
		return maxKeepBind
	}
	return maxKeep
}

// kept reads a kept Parse, Bind or simple Query body. Each is a run of
// NUL-terminated strings first: Parse its statement's name and text, Bind
// its portal's and statement's names, Query its text.
func (c *statementCounter) kept() {
	c.keep = false
	f := strings.SplitN(string(c.body), "\x00", 3)
	switch c.typ {
	case 'P':
		if len(f) >= 2 {
			if c.prepared == nil {
				c.prepared = map[string]stmtKind{}
			}
			c.prepared[f[0]] = kindOf(f[1])
		}
	case 'B':
		c.bound = kindOther
		if len(f) >= 2 {
			c.bound = c.prepared[f[1]]
		}
	case 'Q':
		c.kinds[kindOf(f[0])].Add(1)
	}
}

func (c *statementCounter) stop() {
	c.off = true
	c.uncounted.Add(1)
}
