package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultMaxConnections is the max_connections setting used when
// Options.MaxConnections is zero. Tests open many pools in parallel, so it
// is well above PostgreSQL's own default of 100.
const DefaultMaxConnections = 200

// maxSocketPath is the longest Unix socket path Linux accepts (sun_path
// holds 108 bytes including the terminating NUL).
const maxSocketPath = 107

// Options configures Start. The zero value is ready to use.
type Options struct {
	// Dir is the parent of the cluster's temporary directory. Empty means
	// os.TempDir(). When the process is root, every directory above the
	// cluster must be searchable by the unprivileged user.
	Dir string

	// BinDir holds initdb, pg_ctl and postgres. Empty means FindBinaries().
	BinDir string

	// Logf, when set, receives a line for each step Start and Stop take.
	Logf func(format string, args ...any)

	// Fsync keeps the server durable. When false (the default) fsync,
	// synchronous_commit and full_page_writes are turned off, which makes
	// the server much faster and loses data on a machine crash.
	Fsync bool

	// Settings are extra server settings, passed as -c name=value.
	// They win over the settings Start chooses itself.
	Settings map[string]string

	// MaxConnections is the server's max_connections; zero means
	// DefaultMaxConnections.
	MaxConnections int

	// OSUser is the unprivileged operating-system user to run the server
	// as when the process is root. Empty means $HARVEST_PG_OS_USER, or
	// DefaultOSUser. The user is created when missing. Ignored when the
	// process is not root.
	OSUser string

	// StartTimeout bounds how long pg_ctl waits for the server to accept
	// connections. Zero means 60 seconds.
	StartTimeout time.Duration
}

// Cluster is a running throwaway PostgreSQL server. Its methods are safe
// for concurrent use.
type Cluster struct {
	dir    string
	binDir string
	port   int
	logf   func(string, ...any)
	runAs  *osUser

	stopOnce sync.Once
	stopErr  error
}

// Start initialises a new data directory and starts a server on a free
// port of 127.0.0.1, waiting until it accepts connections. The superuser
// is "postgres", with trust authentication. On failure nothing is left
// behind, and the error includes the end of the server log. The context
// bounds the commands Start runs; the server itself outlives it, until
// Stop.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	c, err := newCluster(ctx, opts)
	if err != nil {
		return nil, err
	}
	if err := c.start(ctx, opts); err != nil {
		_ = c.Stop(context.WithoutCancel(ctx))
		return nil, err
	}
	return c, nil
}

// newCluster finds the binaries and the server's user and makes the
// cluster's directory.
func newCluster(ctx context.Context, opts Options) (*Cluster, error) {
	binDir := opts.BinDir
	if binDir == "" {
		d, err := FindBinaries()
		if err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
		binDir = d
	}
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	parent := opts.Dir
	if parent == "" {
		parent = os.TempDir()
	}

	var runAs *osUser
	if os.Geteuid() == 0 {
		u, err := runAsUser(ctx, opts.OSUser)
		if err != nil {
			return nil, err
		}
		if err := checkTraversable(parent, u.uid, u.gid); err != nil {
			return nil, fmt.Errorf("pgcluster: the server runs as user %q, which cannot reach %s: %v: "+
				"choose a parent directory (Options.Dir) that is searchable by that user, such as %s",
				u.name, parent, err, os.TempDir())
		}
		runAs = &u
	}

	dir, err := os.MkdirTemp(parent, "harvest-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: create directory: %w", err)
	}
	return &Cluster{dir: dir, binDir: binDir, logf: logf, runAs: runAs}, nil
}

func (c *Cluster) dataDir() string { return filepath.Join(c.dir, "data") }
func (c *Cluster) sockDir() string { return filepath.Join(c.dir, "sock") }
func (c *Cluster) logFile() string { return filepath.Join(c.dir, "server.log") }

func (c *Cluster) start(ctx context.Context, opts Options) error {
	if err := c.prepare(); err != nil {
		return err
	}
	c.logf("pgcluster: initdb in %s", c.dataDir())
	if out, err := c.run(ctx, "initdb", "-D", c.dataDir(), "-A", "trust", "-U", "postgres",
		"--no-sync", "-E", "UTF8", "--locale=C"); err != nil {
		return fmt.Errorf("pgcluster: initdb: %w\n%s", err, tail(out, 40))
	}
	return c.launch(ctx, opts)
}

// prepare makes the socket directory and hands the cluster's directories
// to the server's user.
func (c *Cluster) prepare() error {
	if err := os.Mkdir(c.sockDir(), 0o700); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if len(c.sockDir())+len("/.s.PGSQL.65535") > maxSocketPath {
		return fmt.Errorf("pgcluster: socket directory %s is too long for a Unix socket path: choose a shorter Options.Dir", c.sockDir())
	}
	if c.runAs != nil {
		for _, p := range []string{c.dir, c.sockDir()} {
			if err := os.Chown(p, int(c.runAs.uid), int(c.runAs.gid)); err != nil {
				return fmt.Errorf("pgcluster: hand %s to user %q: %w", p, c.runAs.name, err)
			}
		}
		c.logf("pgcluster: running as root, so the server runs as user %q", c.runAs.name)
	}
	return nil
}

// launch starts the server on the data directory, on a free port.
func (c *Cluster) launch(ctx context.Context, opts Options) error {
	timeout := opts.StartTimeout
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	// The port is free when chosen but may be taken before the server binds
	// it; try again with another port in that case.
	var lastErr error
	for range 3 {
		port, err := freePort()
		if err != nil {
			return fmt.Errorf("pgcluster: pick a port: %w", err)
		}
		logStart := fileSize(c.logFile())
		c.logf("pgcluster: starting server on 127.0.0.1:%d", port)
		out, err := c.run(ctx, "pg_ctl", "start", "-D", c.dataDir(), "-w",
			"-t", strconv.Itoa(int((timeout+time.Second-1)/time.Second)),
			"-l", c.logFile(), "-o", serverArgs(port, c.sockDir(), opts))
		if err == nil {
			c.port = port
			c.logf("pgcluster: server ready at %s", c.URL("postgres"))
			return nil
		}
		log := readFrom(c.logFile(), logStart)
		lastErr = fmt.Errorf("pgcluster: pg_ctl start: %w\n%s\nserver log %s:\n%s",
			err, strings.TrimSpace(string(out)), c.logFile(), tail(log, 40))
		if !bytes.Contains(log, []byte("already in use")) || ctx.Err() != nil {
			break
		}
	}
	return lastErr
}

// serverArgs builds pg_ctl's -o value. pg_ctl hands it to /bin/sh, so every
// word is single-quoted.
func serverArgs(port int, sockDir string, opts Options) string {
	maxConns := opts.MaxConnections
	if maxConns <= 0 {
		maxConns = DefaultMaxConnections
	}
	settings := map[string]string{
		"listen_addresses": "127.0.0.1",
		"max_connections":  strconv.Itoa(maxConns),
	}
	if !opts.Fsync {
		settings["fsync"] = "off"
		settings["synchronous_commit"] = "off"
		settings["full_page_writes"] = "off"
	}
	maps.Copy(settings, opts.Settings)

	words := []string{"-p", strconv.Itoa(port), "-k", sockDir}
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		words = append(words, "-c", k+"="+settings[k])
	}
	for i, w := range words {
		words[i] = shellQuote(w)
	}
	return strings.Join(words, " ")
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// run executes one of the server binaries as the right user, from the
// cluster directory, and returns its combined output.
func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, name), args...)
	cmd.Dir = c.dir
	cmd.Env = cleanEnv()
	cmd.Stdout, cmd.Stderr = &out, &out
	// pg_ctl leaves the server running in the background with its output
	// sent to the log file; should anything keep our pipe open, do not
	// wait for it forever.
	cmd.WaitDelay = 5 * time.Second
	if c.runAs != nil {
		cmd.SysProcAttr = c.runAs.credential()
	}
	err := cmd.Run()
	return out.Bytes(), err
}

// cleanEnv is the process environment without libpq's PG* variables, which
// would otherwise steer initdb and pg_ctl (PGDATA, PGPORT, ...).
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	return append(env, "LC_ALL=C")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// URL returns a connection URL for database db as the superuser postgres.
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

// Dir returns the cluster's temporary directory, which holds the data
// directory, the socket directory and the server log. Stop removes it.
func (c *Cluster) Dir() string { return c.dir }

// Port returns the TCP port the server listens on at 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// Stop shuts the server down (fast mode: open sessions are cut off) and
// removes its directory. Calling it again does nothing and returns the
// first call's result.
func (c *Cluster) Stop(ctx context.Context) error {
	c.stopOnce.Do(func() { c.stopErr = c.stop(ctx) })
	return c.stopErr
}

func (c *Cluster) stop(ctx context.Context) error {
	var errs []error
	if _, err := os.Stat(filepath.Join(c.dataDir(), "postmaster.pid")); err == nil {
		c.logf("pgcluster: stopping server on port %d", c.port)
		if out, err := c.run(ctx, "pg_ctl", "stop", "-D", c.dataDir(), "-m", "fast", "-w"); err != nil {
			errs = append(errs, fmt.Errorf("pgcluster: pg_ctl stop: %w: %s", err, strings.TrimSpace(string(out))))
			// Last resort before the directory goes away under the server.
			_, _ = c.run(context.WithoutCancel(ctx), "pg_ctl", "stop", "-D", c.dataDir(), "-m", "immediate", "-w")
		}
	}
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, fmt.Errorf("pgcluster: remove %s: %w", c.dir, err))
	}
	return errors.Join(errs...)
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// readFrom returns the contents of path from offset on, or nothing.
func readFrom(path string, offset int64) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(f, 1<<20))
	return b
}

// tail returns at most the last n lines of b.
func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{"..."}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}
