package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/config"
	"github.com/harvest-run/harvest/internal/directory"
	"github.com/harvest-run/harvest/internal/natsconn"
	"github.com/harvest-run/harvest/internal/tenantmove"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// tenantsEnv is what `harvest tenants` reads from the environment: the
// shards, NATS for the change announcements (best effort), the system
// limit a move takes capacity under, and the gateways' subject prefix.
type tenantsEnv struct {
	config.Common
	tenantcap.Settings
	Prefix string `envconfig:"GATEWAY_SUBJECT_PREFIX" default:"harvest"`
}

const tenantsUsage = `tenants <list|pin|move> [flags]

  list [--json]                         every tenant: home shard, how it got it, unfinished
                                        runs, fairness keys, and a move in progress
  pin TENANT --shard N [--json]         record shard N as the home of a tenant that has no
                                        runs yet (a new tenant, before its first start)
  move TENANT --to N [--batch 500]      move a tenant's home to shard N and copy its runs
                                        there, online

A tenant's home is recorded on shard 0 the first time the fleet sees it
(docs/limits.md). move fences the old home, switches the tenant's starts to
shard N and copies its runs in batches, printing one line per step; starts
keep being accepted all along. It is safe to interrupt (Ctrl-C) or kill:
run the same command again and it resumes where it stopped
(docs/operations.md, "Moving a tenant").

Reads HARVEST_SHARDS, HARVEST_MAX_RUNS (the system limit the new home takes
capacity under) and HARVEST_NATS_URL (to tell the gateways at once; without
it they notice within their directory refresh). Exit codes: 0 done,
1 error, 2 bad usage.`

// tenantsRequest is a parsed command line of harvest tenants.
type tenantsRequest struct {
	sub     string // list, pin or move
	tenant  string
	shard   int // pin's --shard, move's --to
	batch   int
	asJSON  bool
	timeout time.Duration
}

func runTenants(ctx context.Context, e env, args []string) error {
	req, err := parseTenants(e, args)
	if err != nil {
		return err
	}
	var cfg tenantsEnv
	if err := config.Load(&cfg); err != nil {
		return usageError{Msg: err.Error()}
	}
	if err := cfg.Shards.Validate(); err != nil {
		return usageError{Msg: err.Error()}
	}
	if err := cfg.Settings.Validate(); err != nil {
		return usageError{Msg: err.Error()}
	}
	return execTenants(ctx, e, cfg, req)
}

// parseTenants reads the command line; every mistake it can see without
// the environment is a usage error here.
func parseTenants(e env, args []string) (tenantsRequest, error) {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(e.stdout, "usage: harvest "+tenantsUsage)
		return tenantsRequest{}, flag.ErrHelp
	}
	req := tenantsRequest{sub: args[0]}
	fs := newFlags(e, "tenants "+req.sub, tenantsUsage)
	var shard, to *int
	var batch *int
	var asJSON *bool
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for the shards (list, pin)")
	switch req.sub {
	case "list":
		asJSON = fs.Bool("json", false, "print the tenants as JSON")
	case "pin":
		shard = fs.Int("shard", -1, "the shard to record as the tenant's home (required)")
		asJSON = fs.Bool("json", false, "print the entry as JSON")
	case "move":
		to = fs.Int("to", -1, "the shard to move the tenant to (required)")
		batch = fs.Int("batch", tenantmove.DefaultBatch, "most runs copied in one step")
	default:
		return req, usageError{Msg: fmt.Sprintf("unknown tenants command %q (want list, pin or move)", req.sub)}
	}
	rest := args[1:]
	if req.sub != "list" {
		req.tenant, rest = splitPositional(rest)
	}
	if err := parseFlags(fs, rest); err != nil {
		return req, err
	}
	if asJSON != nil {
		req.asJSON = *asJSON
	}
	req.timeout = *timeout
	if req.timeout <= 0 {
		return req, usageError{Msg: "--timeout must be positive"}
	}
	if req.sub == "list" {
		return req, nil
	}
	if req.tenant == "" {
		return req, usageError{Msg: fmt.Sprintf("name the tenant: harvest tenants %s TENANT", req.sub)}
	}
	if err := auth.ValidateTenant(req.tenant); err != nil {
		return req, usageError{Msg: "TENANT: " + err.Error()}
	}
	switch req.sub {
	case "pin":
		if !flagSet(fs, "shard") {
			return req, usageError{Msg: "--shard is required: the shard to record as the home"}
		}
		if *shard < 0 {
			return req, usageError{Msg: fmt.Sprintf("--shard %d: a shard is numbered from 0", *shard)}
		}
		req.shard = *shard
	case "move":
		if !flagSet(fs, "to") {
			return req, usageError{Msg: "--to is required: the shard to move the tenant to"}
		}
		if *to < 0 {
			return req, usageError{Msg: fmt.Sprintf("--to %d: a shard is numbered from 0", *to)}
		}
		if *batch < 1 {
			return req, usageError{Msg: fmt.Sprintf("--batch %d: must be at least 1", *batch)}
		}
		req.shard, req.batch = *to, *batch
	}
	return req, nil
}

// execTenants runs a parsed request against the shards of cfg.
func execTenants(ctx context.Context, e env, cfg tenantsEnv, req tenantsRequest) error {
	if req.sub != "list" && req.shard >= len(cfg.Shards) {
		name := "--shard"
		if req.sub == "move" {
			name = "--to"
		}
		return usageError{Msg: fmt.Sprintf("%s %d: HARVEST_SHARDS has %d shards (0 to %d)", name, req.shard, len(cfg.Shards), len(cfg.Shards)-1)}
	}
	// A move holds a transaction on each of two shards while it reads and
	// writes others; a few connections per shard leave it room.
	set, err := openShardSet(ctx, cfg.Shards, 4)
	if err != nil {
		return err
	}
	defer set.Close()
	o := tenantmove.Options{
		Shards:  set.pools,
		Prefix:  cfg.Prefix,
		MaxRuns: cfg.MaxRuns,
		Batch:   req.batch,
		Log:     slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if req.sub != "list" {
		if nc := tenantsNATS(e, cfg); nc != nil {
			o.NATS = nc
			defer func() {
				_ = nc.FlushTimeout(2 * time.Second)
				nc.Close()
			}()
		}
	}
	switch req.sub {
	case "list":
		lctx, cancel := context.WithTimeout(ctx, req.timeout)
		defer cancel()
		list, err := tenantmove.List(lctx, o)
		if err != nil {
			return fmt.Errorf("list: %w", err)
		}
		if list == nil {
			list = []tenantmove.Tenant{}
		}
		if req.asJSON {
			return writeJSON(e.stdout, list)
		}
		printTenants(e.stdout, list)
		return nil
	case "pin":
		pctx, cancel := context.WithTimeout(ctx, req.timeout)
		defer cancel()
		entry, err := tenantmove.Pin(pctx, o, req.tenant, req.shard)
		if err != nil {
			return fmt.Errorf("pin %s: %w", req.tenant, err)
		}
		if req.asJSON {
			return writeJSON(e.stdout, entry)
		}
		fmt.Fprintf(e.stdout, "%s: home shard %d (placed by %s, version %d)\n",
			entry.Tenant, entry.Shard, entry.PlacedBy, entry.Version)
		return nil
	}
	return moveTenant(ctx, e, o, req)
}

// moveTenant runs tenantmove.Move, printing each step as it commits.
func moveTenant(ctx context.Context, e env, o tenantmove.Options, req tenantsRequest) error {
	tenant, to := req.tenant, req.shard
	again := fmt.Sprintf("harvest tenants move %s --to %d", tenant, to)
	// The entry before the move names the old home in the progress lines,
	// and says whether this run resumes one that stopped.
	from := "the old home"
	gctx, cancel := context.WithTimeout(ctx, req.timeout)
	entry, err := directory.Get(gctx, o.Shards[0], tenant)
	cancel()
	switch {
	case err == nil && entry.Phase == directory.PhaseCopying:
		from = "shard " + strconv.Itoa(entry.From())
		if entry.Shard == to {
			fmt.Fprintf(e.stdout, "resuming the move of %s from %s to shard %d (its runs are being copied)\n", tenant, from, to)
		}
	case err == nil && entry.Phase == directory.PhaseFencing:
		from = "shard " + strconv.Itoa(entry.Shard)
		if entry.Target() == to {
			fmt.Fprintf(e.stdout, "resuming the move of %s from %s to shard %d (fencing)\n", tenant, from, to)
		}
	case err == nil:
		from = "shard " + strconv.Itoa(entry.Shard)
	case errors.Is(err, directory.ErrNoEntry):
	default:
		if ctx.Err() != nil {
			return interrupted(tenant, "", again)
		}
		return fmt.Errorf("move %s: read its entry: %w", tenant, err)
	}

	last := ""
	o.Progress = func(s tenantmove.Step) {
		last = s.Name
		if s.Batch > 0 {
			last = fmt.Sprintf("%s (batch %d)", s.Name, s.Batch)
		}
		fmt.Fprintln(e.stdout, stepLine(s, tenant, from, to))
	}
	rep, err := tenantmove.Move(ctx, o, tenant, to)
	if err != nil {
		if ctx.Err() != nil {
			return interrupted(tenant, last, again)
		}
		if last != "" {
			// The steps so far are committed: running it again goes on
			// from the last one.
			return fmt.Errorf("move %s: %w (stopped after %s; run %s to resume)", tenant, err, last, again)
		}
		return fmt.Errorf("move %s: %w", tenant, err)
	}
	if rep.AlreadyHome {
		fmt.Fprintf(e.stdout, "%s: its home is shard %d already; nothing to move\n", tenant, rep.To)
		return nil
	}
	fmt.Fprintf(e.stdout, "moved %s from shard %d to shard %d: %s runs in %s batches, %s\n",
		tenant, rep.From, rep.To, thousands(int64(rep.Runs)), thousands(int64(rep.Batches)), rep.Elapsed.Round(time.Millisecond))
	return nil
}

// interrupted is the error of a move stopped by Ctrl-C: what was done is
// committed, and the same command resumes.
func interrupted(tenant, last, again string) error {
	where := "before its first step"
	if last != "" {
		where = "after " + last
	}
	return fmt.Errorf("move of %s interrupted %s; every step so far is kept: run %s to resume it", tenant, where, again)
}

// stepLine is the progress line of one committed step.
func stepLine(s tenantmove.Step, tenant, from string, to int) string {
	switch s.Name {
	case "intent":
		return fmt.Sprintf("intent: move of %s from %s to shard %d recorded", tenant, from, to)
	case "fence":
		return fmt.Sprintf("fence: %s refuses new starts of %s (the gateways send them to shard %d)", from, tenant, to)
	case "prepare":
		return fmt.Sprintf("prepare: shard %d has %s's fairness debt, weights and quotas; %s unfinished runs still counted on %s",
			to, tenant, thousands(int64(s.Waiting)), from)
	case "switch":
		return fmt.Sprintf("switch: shard %d takes %s's starts", to, tenant)
	case "hide":
		return fmt.Sprintf("hide: batch %d, %s runs taken out of %s's claims", s.Batch, thousands(int64(s.Runs)), from)
	case "copy":
		return fmt.Sprintf("copy: batch %d, %s runs written on shard %d", s.Batch, thousands(int64(s.Runs)), to)
	case "drop":
		return fmt.Sprintf("drop: batch %d, %s runs removed from %s (%s left)", s.Batch, thousands(int64(s.Runs)), from, thousands(int64(s.Waiting)))
	case "capacity":
		return fmt.Sprintf("capacity: waiting for room on shard %d (its lease is %s, the copy needs %s): runs must finish first, or HARVEST_MAX_RUNS here is lower than the gateways'",
			to, thousands(int64(s.Waiting)), thousands(int64(s.Runs)))
	case "wait":
		return fmt.Sprintf("wait: %s runs left on %s, their tasks running or due later", thousands(int64(s.Waiting)), from)
	case "deferred":
		return fmt.Sprintf("deferred: %s runs (%s left on %s)", thousands(int64(s.Runs)), thousands(int64(s.Waiting)), from)
	case "settle":
		return fmt.Sprintf("settle: %s's counts recounted on %s and shard %d", tenant, from, to)
	case "done":
		return fmt.Sprintf("done: %s's home is shard %d", tenant, to)
	}
	return fmt.Sprintf("%s: batch %d, %d runs (%d left)", s.Name, s.Batch, s.Runs, s.Waiting)
}

func printTenants(w io.Writer, list []tenantmove.Tenant) {
	if len(list) == 0 {
		fmt.Fprintln(w, "no tenants yet: a tenant is recorded at its first start (or by harvest tenants pin)")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tHOME\tPLACED\tUNFINISHED\tKEYS\tMOVE")
	for _, t := range list {
		home, placed := strconv.Itoa(t.Home), t.Entry.PlacedBy
		if t.Home < 0 {
			home, placed = "-", "(no entry)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.Tenant, home, nonEmpty(placed, "-"),
			thousands(t.Unfinished), thousands(t.Keys), movePhase(t.Entry))
	}
	tw.Flush()
}

// movePhase describes a move in progress, or "-".
func movePhase(e directory.Entry) string {
	switch e.Phase {
	case directory.PhaseFencing:
		return fmt.Sprintf("fencing (to shard %d)", e.Target())
	case directory.PhaseCopying:
		return fmt.Sprintf("copying (from shard %d)", e.From())
	}
	return "-"
}

// thousands formats n with commas: 1,200.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// tenantsNATS connects to HARVEST_NATS_URL for the announcements, or says
// why not: they are hints, and the gateways re-read the directory anyway.
func tenantsNATS(e env, cfg tenantsEnv) *nats.Conn {
	if cfg.NATSURL == "" {
		return nil
	}
	nc, err := natsconn.Connect(cfg.NATSURL, natsconn.Options{Name: "harvest-cli", FailFast: true}, nats.Timeout(time.Second))
	if err != nil {
		fmt.Fprintf(e.stderr, "note: changes not announced over NATS (%v); the gateways pick them up from shard 0 within seconds\n", err)
		return nil
	}
	return nc
}
