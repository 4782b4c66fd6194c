package natsembed

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// DefaultReadyTimeout is how long Start waits for the server to accept
// clients when Options.ReadyTimeout is zero.
const DefaultReadyTimeout = 10 * time.Second

// Options configures Start. The zero value starts a bare server with
// JetStream on a random port.
type Options struct {
	// Port is the client port on 127.0.0.1. Zero picks a free port.
	Port int

	// ConfigFile, when set, is a nats-server configuration file to start
	// from (accounts, users, permissions, limits...). Its host, client
	// port and JetStream store directory are replaced by this package's
	// choices, and JetStream is turned on whatever the file says.
	ConfigFile string

	// Dir is the parent of the temporary JetStream store directory. Empty
	// means os.TempDir().
	Dir string

	// Logf, when set, receives the server's log lines. Nil keeps the
	// server silent.
	Logf func(format string, args ...any)

	// ReadyTimeout bounds the wait for the server to accept clients; zero
	// means DefaultReadyTimeout.
	ReadyTimeout time.Duration
}

// Server is a running embedded NATS server.
type Server struct {
	ns       *server.Server
	url      string
	storeDir string

	shutdownOnce sync.Once
}

// Start starts a server and waits until it accepts clients and JetStream
// is enabled. On failure nothing is left running and the store directory is
// removed.
func Start(opts Options) (*Server, error) {
	sopts := &server.Options{}
	if opts.ConfigFile != "" {
		o, err := server.ProcessConfigFile(opts.ConfigFile)
		if err != nil {
			return nil, fmt.Errorf("natsembed: config file %s: %w", opts.ConfigFile, err)
		}
		sopts = o
	}
	storeDir, err := os.MkdirTemp(opts.Dir, "harvest-nats-")
	if err != nil {
		return nil, fmt.Errorf("natsembed: create store directory: %w", err)
	}

	sopts.Host = "127.0.0.1"
	sopts.Port = opts.Port
	if sopts.Port == 0 {
		// Zero would mean the default port 4222 to nats-server.
		sopts.Port = server.RANDOM_PORT
	}
	sopts.JetStream = true
	sopts.StoreDir = storeDir
	sopts.NoSigs = true
	sopts.NoLog = opts.Logf == nil
	sopts.Debug, sopts.Trace, sopts.TraceVerbose = false, false, false

	ns, err := server.NewServer(sopts)
	if err != nil {
		_ = os.RemoveAll(storeDir)
		return nil, fmt.Errorf("natsembed: %w", err)
	}
	if opts.Logf != nil {
		ns.SetLoggerV2(logger{opts.Logf}, false, false, false)
	}
	s := &Server{ns: ns, storeDir: storeDir}

	timeout := opts.ReadyTimeout
	if timeout <= 0 {
		timeout = DefaultReadyTimeout
	}
	ns.Start()
	if !ns.ReadyForConnections(timeout) {
		s.Shutdown()
		return nil, fmt.Errorf("natsembed: server not ready for connections after %s", timeout)
	}
	if !ns.JetStreamEnabled() {
		s.Shutdown()
		return nil, errors.New("natsembed: JetStream did not start (set Options.Logf to see why)")
	}
	addr, ok := ns.Addr().(*net.TCPAddr)
	if !ok {
		s.Shutdown()
		return nil, fmt.Errorf("natsembed: unexpected listener address %v", ns.Addr())
	}
	s.url = "nats://" + net.JoinHostPort(addr.IP.String(), strconv.Itoa(addr.Port))
	return s, nil
}

// URL returns the address clients connect to, such as nats://127.0.0.1:41234.
func (s *Server) URL() string { return s.url }

// Shutdown stops the server, waits until it has stopped and removes the
// JetStream store directory. Later calls do nothing.
func (s *Server) Shutdown() {
	s.shutdownOnce.Do(func() {
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
		_ = os.RemoveAll(s.storeDir)
	})
}

// logger forwards the server's log lines to a printf-style function.
type logger struct{ logf func(string, ...any) }

func (l logger) Noticef(format string, v ...any) { l.logf("[INF] "+format, v...) }
func (l logger) Warnf(format string, v ...any)   { l.logf("[WRN] "+format, v...) }
func (l logger) Fatalf(format string, v ...any)  { l.logf("[FTL] "+format, v...) }
func (l logger) Errorf(format string, v ...any)  { l.logf("[ERR] "+format, v...) }
func (l logger) Debugf(format string, v ...any)  { l.logf("[DBG] "+format, v...) }
func (l logger) Tracef(format string, v ...any)  { l.logf("[TRC] "+format, v...) }
