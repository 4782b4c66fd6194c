package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// StandbyOptions configure StartStandby.
type StandbyOptions struct {
	// Synchronous makes the primary wait for the standby at every commit.
	Synchronous bool
	// Upstream is the host:port the standby takes its base backup from and
	// streams from, the primary's own port on 127.0.0.1 when empty. Tests
	// put a proxy there, to hold the stream back as a lagging standby
	// would lack it.
	Upstream string
}

// StartStandby makes a streaming standby of the running cluster c: a base
// backup of c taken with pg_basebackup over TCP (initdb's pg_hba.conf
// already lets the superuser replicate from 127.0.0.1, and wal_level=replica
// is PostgreSQL's default), started on a free port with opts. Give it the
// primary's options: a hot standby refuses to start with a lower
// max_connections than its primary's. It returns once the primary reports
// the standby streaming.
//
// With so.Synchronous, the primary then names it its synchronous standby
// (synchronous_standby_names = '*', written with ALTER SYSTEM on the
// primary alone, so that a promoted standby does not wait for a standby of
// its own), and from then on a commit on the primary returns only once the
// standby has flushed its commit record. That needs synchronous_commit on
// at the primary: set it in the primary's Options.Settings (pgcluster
// turns it off unless Options.Fsync).
//
// Stop the standby like any cluster; Promote makes it a primary.
func (c *Cluster) StartStandby(ctx context.Context, opts Options, so StandbyOptions) (*Cluster, error) {
	if so.Synchronous {
		var mode string
		if err := c.query(ctx, "SHOW synchronous_commit", &mode); err != nil {
			return nil, err
		}
		if mode == "off" || mode == "local" {
			return nil, fmt.Errorf("pgcluster: a synchronous standby needs synchronous_commit on at the primary, which has %q: set it in Options.Settings", mode)
		}
	}
	upstream := so.Upstream
	if upstream == "" {
		upstream = net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port))
	}
	s, err := newCluster(ctx, opts)
	if err != nil {
		return nil, err
	}
	if err := s.startStandby(ctx, c, upstream, opts); err != nil {
		_ = s.Stop(context.WithoutCancel(ctx))
		return nil, err
	}
	if so.Synchronous {
		c.logf("pgcluster: server on port %d waits for its standby at every commit", c.port)
		if err := c.exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = '*'", "SELECT pg_reload_conf()"); err != nil {
			_ = s.Stop(context.WithoutCancel(ctx))
			return nil, err
		}
		if err := c.waitFor(ctx, "SELECT count(*) > 0 FROM pg_stat_replication WHERE sync_state = 'sync'"); err != nil {
			_ = s.Stop(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("pgcluster: the standby did not become synchronous: %w", err)
		}
	}
	return s, nil
}

func (c *Cluster) startStandby(ctx context.Context, primary *Cluster, upstream string, opts Options) error {
	if err := c.prepare(); err != nil {
		return err
	}
	host, port, err := net.SplitHostPort(upstream)
	if err != nil {
		return fmt.Errorf("pgcluster: standby upstream %q: %w", upstream, err)
	}
	c.logf("pgcluster: base backup of port %d through %s in %s", primary.port, upstream, c.dataDir())
	// -R writes standby.signal and primary_conninfo (naming upstream); a
	// fast checkpoint starts the backup at once rather than after a spread
	// checkpoint.
	if out, err := c.run(ctx, "pg_basebackup", "-D", c.dataDir(), "-h", host,
		"-p", port, "-U", "postgres", "-R", "-X", "stream",
		"--checkpoint=fast", "--no-sync"); err != nil {
		return fmt.Errorf("pgcluster: pg_basebackup: %w\n%s", err, tail(out, 40))
	}
	if err := c.launch(ctx, opts); err != nil {
		return err
	}
	if err := primary.waitFor(ctx, "SELECT count(*) > 0 FROM pg_stat_replication WHERE state = 'streaming'"); err != nil {
		return fmt.Errorf("pgcluster: the standby on port %d does not stream: %w\nserver log:\n%s",
			c.port, err, tail(readFrom(c.logFile(), 0), 40))
	}
	return nil
}

// Promote makes a standby a primary (pg_ctl promote) and returns once it
// takes writes.
func (c *Cluster) Promote(ctx context.Context) error {
	c.logf("pgcluster: promoting the standby on port %d", c.port)
	if out, err := c.run(ctx, "pg_ctl", "promote", "-D", c.dataDir(), "-w", "-t", "60"); err != nil {
		return fmt.Errorf("pgcluster: pg_ctl promote: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return c.waitFor(ctx, "SELECT NOT pg_is_in_recovery()")
}

// Kill stops the server at once (pg_ctl stop -m immediate), as a crash of
// its machine would: sessions are cut off without a goodbye and nothing is
// checkpointed. Commits the server acknowledged stay in its data
// directory, which Stop still removes.
func (c *Cluster) Kill(ctx context.Context) error {
	c.logf("pgcluster: killing the server on port %d", c.port)
	if out, err := c.run(ctx, "pg_ctl", "stop", "-D", c.dataDir(), "-m", "immediate", "-w"); err != nil {
		return fmt.Errorf("pgcluster: pg_ctl stop -m immediate: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// query reads one value from the server's postgres database.
func (c *Cluster) query(ctx context.Context, sql string, dest any) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: connect to port %d: %w", c.port, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := conn.QueryRow(ctx, sql).Scan(dest); err != nil {
		return fmt.Errorf("pgcluster: %s: %w", sql, err)
	}
	return nil
}

// exec runs statements on the server's postgres database.
func (c *Cluster) exec(ctx context.Context, stmts ...string) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: connect to port %d: %w", c.port, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, q := range stmts {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("pgcluster: %s: %w", q, err)
		}
	}
	return nil
}

// waitFor polls a query returning one boolean until it returns true, for
// at most a minute.
func (c *Cluster) waitFor(ctx context.Context, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last error
	for {
		var ok bool
		err := c.query(ctx, sql, &ok)
		if err == nil && ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("pgcluster: waiting for %q on port %d: %w", sql, c.port, ctx.Err()), last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
