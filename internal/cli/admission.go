package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/config"
	"github.com/harvest-run/harvest/internal/natsconn"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
	"github.com/harvest-run/harvest/pkg/shard"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// admissionEnv is what `harvest admission` reads from the environment.
type admissionEnv struct {
	config.Common
	tenantcap.Settings
	// TokensFile is the gateway's tokens file; its tenant-bound tokens are
	// the registered tenants the static algorithm divides by.
	TokensFile string `envconfig:"GATEWAY_TOKENS_FILE"`
	Prefix     string `envconfig:"GATEWAY_SUBJECT_PREFIX" default:"harvest"`
}

const admissionUsage = "admission get [--json] | set [--algorithm no_limit|static|dynamic] [--tfm X] [--scheduled-share X] [--json] | priority --tenant T [--max N | --clear] [--json]"

func runAdmission(ctx context.Context, e env, args []string) error {
	if len(args) == 0 {
		return usageError{Msg: "usage: harvest " + admissionUsage}
	}
	switch args[0] {
	case "get":
		return admissionGet(ctx, e, args[1:])
	case "set":
		return admissionSet(ctx, e, args[1:])
	case "priority":
		return admissionPriority(ctx, e, args[1:])
	case "-h", "--help", "help":
		fmt.Fprintln(e.stdout, "usage: harvest "+admissionUsage)
		return nil
	}
	return usageError{Msg: fmt.Sprintf("unknown admission command %q (want get, set or priority)", args[0])}
}

func loadAdmissionEnv() (admissionEnv, error) {
	var cfg admissionEnv
	if err := config.Load(&cfg); err != nil {
		return cfg, usageError{Msg: err.Error()}
	}
	if err := cfg.Shards.Validate(); err != nil {
		return cfg, usageError{Msg: err.Error()}
	}
	if err := cfg.Settings.Validate(); err != nil {
		return cfg, usageError{Msg: err.Error()}
	}
	return cfg, nil
}

func admissionGet(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "admission get", "admission get [--json] [--tokens FILE] [--timeout 10s]")
	asJSON := fs.Bool("json", false, "print the GET /v1/admission body")
	tokens := fs.String("tokens", "", "tokens file naming the registered tenants (default $HARVEST_GATEWAY_TOKENS_FILE)")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for each shard")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	gw, err := loadGateway()
	if err != nil {
		return err
	}
	if gw != nil {
		// Through the gateway: it counts its own registered tenants.
		cctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		view, err := gw.Admission(cctx)
		if err != nil {
			return err
		}
		return printAdmission(e, view, *asJSON)
	}
	cfg, err := loadAdmissionEnv()
	if err != nil {
		return err
	}
	view, err := readAdmission(ctx, e, cfg, *tokens, *timeout)
	if err != nil {
		return err
	}
	return printAdmission(e, view, *asJSON)
}

// readAdmission builds the same view as GET /v1/admission, straight from
// the shards.
func readAdmission(ctx context.Context, e env, cfg admissionEnv, tokensFlag string, timeout time.Duration) (api.AdmissionView, error) {
	tenants, err := registeredTenants(e, cfg, tokensFlag)
	if err != nil {
		return api.AdmissionView{}, err
	}
	set, err := openShardSet(ctx, cfg.Shards, 1)
	if err != nil {
		return api.AdmissionView{}, err
	}
	defer set.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cur, err := tenantcap.LoadConfig(ctx, set.pools[0])
	if err != nil {
		return api.AdmissionView{}, set.named(0, err)
	}
	ceilings, err := tenantcap.LoadCeilings(ctx, set.pools[0])
	if err != nil {
		return api.AdmissionView{}, set.named(0, err)
	}
	// A shard other than 0 that does not answer is listed in the view's
	// unavailable_shards, as GET /v1/admission lists it.
	dbs := make([]shard.Querier, len(set.pools))
	for i, p := range set.pools {
		dbs[i] = p
	}
	return tenantcap.BuildAdmissionView(ctx, dbs, cur, ceilings, cfg.MaxRuns, tenants)
}

// registeredTenants reads the tenants of the tokens file, when one is named.
func registeredTenants(e env, cfg admissionEnv, flagPath string) ([]string, error) {
	path := flagPath
	if path == "" {
		path = cfg.TokensFile
	}
	if path == "" {
		fmt.Fprintln(e.stderr, "note: no tokens file (--tokens or HARVEST_GATEWAY_TOKENS_FILE): counting 0 registered tenants")
		return nil, nil
	}
	set, err := auth.LoadTokens(path)
	if err != nil {
		return nil, err
	}
	return set.Tenants(), nil
}

func printAdmission(e env, v api.AdmissionView, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	w := e.stdout
	fmt.Fprintf(w, "algorithm      %s\n", v.Algorithm)
	fmt.Fprintf(w, "tfm            %s\n", strconv.FormatFloat(v.TFM, 'g', -1, 64))
	fmt.Fprintf(w, "max_runs       %d (read-only: HARVEST_MAX_RUNS)\n", v.MaxRuns)
	fmt.Fprintf(w, "tenants        %d\n", v.Tenants)
	fmt.Fprintf(w, "running_total  %d\n", v.RunningTotal)
	if v.Limit == nil {
		fmt.Fprintln(w, "limit          none (only max_runs applies)")
	} else {
		fmt.Fprintf(w, "limit          %d per tenant\n", *v.Limit)
	}
	fmt.Fprintf(w, "scheduled      at most %d runs not due yet per tenant (scheduled_share %s)\n",
		v.ScheduledCap, strconv.FormatFloat(v.ScheduledShare, 'g', -1, 64))
	if v.UpdatedBy != "" {
		fmt.Fprintf(w, "updated        %s by %s\n", v.UpdatedAt, v.UpdatedBy)
	}
	if len(v.UnavailableShards) > 0 {
		fmt.Fprintf(w, "unavailable    shards %v (their runs are not counted above)\n", v.UnavailableShards)
	}
	names := make([]string, 0, len(v.Running))
	for t := range v.Running {
		names = append(names, t)
	}
	sort.Strings(names)
	if len(names) > 0 {
		fmt.Fprintln(w, "running:")
	}
	for _, t := range names {
		fmt.Fprintf(w, "  %-24s %d\n", t, v.Running[t])
	}
	fmt.Fprintf(w, "priority ceilings (others: %d):\n", api.DefaultMaxPriority)
	for _, c := range v.PriorityCeilings {
		fmt.Fprintf(w, "  %-24s %d (by %s)\n", c.Tenant, c.MaxPriority, c.UpdatedBy)
	}
	return nil
}

func admissionSet(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "admission set", "admission set [--algorithm no_limit|static|dynamic] [--tfm X] [--scheduled-share X] [--json]")
	algo := fs.String("algorithm", "", "no_limit, static or dynamic")
	tfm := fs.String("tfm", "", "tenant fairness multiplier: a positive finite number")
	share := fs.String("scheduled-share", "", "share of a tenant's budget its runs not due yet may hold: above 0, at most 1")
	asJSON := fs.Bool("json", false, "print the GET /v1/admission body afterwards")
	tokens := fs.String("tokens", "", "tokens file naming the registered tenants (default $HARVEST_GATEWAY_TOKENS_FILE)")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for each shard")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var p tenantcap.Patch
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["algorithm"] {
		a := api.Algorithm(*algo)
		p.Algorithm = &a
	}
	if set["tfm"] {
		v, err := strconv.ParseFloat(*tfm, 64)
		if err != nil {
			return usageError{Msg: fmt.Sprintf("--tfm: %q is not a number", *tfm)}
		}
		p.TFM = &v
	}
	if set["scheduled-share"] {
		v, err := strconv.ParseFloat(*share, 64)
		if err != nil {
			return usageError{Msg: fmt.Sprintf("--scheduled-share: %q is not a number", *share)}
		}
		p.ScheduledShare = &v
	}
	if p.Empty() {
		return usageError{Msg: "nothing to set: give --algorithm, --tfm, --scheduled-share or several"}
	}
	gw, err := loadGateway()
	if err != nil {
		return err
	}
	if gw != nil {
		return admissionSetGateway(ctx, e, gw, p, *asJSON, *timeout)
	}
	cfg, err := loadAdmissionEnv()
	if err != nil {
		return err
	}
	shard0, err := openShardSet(ctx, cfg.Shards[:1], 1)
	if err != nil {
		return err
	}
	defer shard0.Close()
	sctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	p.MaxRuns = cfg.Settings.MaxRuns
	cur, err := tenantcap.UpdateConfig(sctx, shard0.pools[0], cliActor(), p)
	if err != nil {
		return admissionSetError(shard0.named(0, err))
	}
	announce(ctx, e, cfg, cur)
	if !*asJSON {
		fmt.Fprintf(e.stdout, "admission set: algorithm %s, tfm %s (by %s)\n",
			cur.Algorithm, strconv.FormatFloat(cur.TFM, 'g', -1, 64), cur.UpdatedBy)
		return nil
	}
	view, err := readAdmission(ctx, e, cfg, *tokens, *timeout)
	if err != nil {
		return err
	}
	return printAdmission(e, view, true)
}

// admissionSetError makes a refused value (audited by whoever refused
// it) a usage mistake naming the flag; other errors stay as they are.
func admissionSetError(err error) error {
	var ae *api.Error
	if errors.As(err, &ae) && ae.Code == api.CodeInvalidArgument {
		if ae.Field != "" {
			return usageError{Msg: "--" + strings.ReplaceAll(ae.Field, "_", "-") + ": " + ae.Message}
		}
		return usageError{Msg: ae.Message}
	}
	return err
}

// admissionSetGateway is admission set through a gateway (PUT
// /v1/admission): the gateway persists, audits with the token's name and
// announces the change; the output is the same as the direct path's.
func admissionSetGateway(ctx context.Context, e env, gw *client.Client, p tenantcap.Patch, asJSON bool, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ch := client.AdmissionChange{Algorithm: p.Algorithm, TFM: p.TFM, ScheduledShare: p.ScheduledShare}
	if p.TFM != nil && (math.IsNaN(*p.TFM) || math.IsInf(*p.TFM, 0)) {
		// JSON cannot carry it; the gateway would refuse it anyway.
		return admissionSetError(tenantcap.ValidateTFM(*p.TFM))
	}
	view, err := gw.SetAdmission(ctx, ch)
	if err != nil {
		return admissionSetError(err)
	}
	if asJSON {
		return printAdmission(e, view, true)
	}
	fmt.Fprintf(e.stdout, "admission set: algorithm %s, tfm %s (by %s)\n",
		view.Algorithm, strconv.FormatFloat(view.TFM, 'g', -1, 64), view.UpdatedBy)
	return nil
}

// announce tells the gateways over NATS; without NATS they pick the change
// up at their next periodic reload, so a failure here is only a note.
func announce(ctx context.Context, e env, cfg admissionEnv, cur tenantcap.Current) {
	nc, err := natsconn.Connect(cfg.NATSURL, natsconn.Options{Name: "harvest admission set", FailFast: true})
	if err == nil {
		defer nc.Close()
		if err = tenantcap.PublishChange(ctx, nc, cfg.Prefix, cur); err == nil {
			err = nc.FlushTimeout(2 * time.Second)
		}
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "note: change saved but not announced over NATS (%v); gateways apply it within HARVEST_ADMISSION_RELOAD (%s)\n",
			err, cfg.Reload)
	}
}

// admissionPriority reads, sets or clears a tenant's priority ceiling,
// through the gateway when HARVEST_GATEWAY_URL is set, else on shard 0
// (then announced over NATS like an admission change).
func admissionPriority(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "admission priority", "admission priority --tenant T [--max N | --clear] [--json]")
	tenant := fs.String("tenant", "", "the tenant (required)")
	maxP := fs.Int("max", 0, fmt.Sprintf("the highest priority the tenant's starts may carry, %d to %d", api.MinPriority, api.MaxPriority))
	clear := fs.Bool("clear", false, fmt.Sprintf("back to the default ceiling, %d", api.DefaultMaxPriority))
	asJSON := fs.Bool("json", false, "print the ceiling as JSON")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for shard 0 or the gateway")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case *tenant == "":
		return usageError{Msg: "--tenant is required"}
	case set["max"] && *clear:
		return usageError{Msg: "give --max or --clear, not both"}
	}
	if err := auth.ValidateTenant(*tenant); err != nil {
		return usageError{Msg: "--tenant: " + err.Error()}
	}
	cctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	gw, err := loadGateway()
	if err != nil {
		return err
	}
	var c api.PriorityCeiling
	if gw != nil {
		switch {
		case set["max"]:
			c, err = gw.SetPriorityCeiling(cctx, *tenant, *maxP)
		case *clear:
			c, err = gw.ClearPriorityCeiling(cctx, *tenant)
		default:
			c, err = gw.PriorityCeiling(cctx, *tenant)
		}
	} else {
		c, err = admissionPriorityDirect(cctx, e, *tenant, set["max"], *maxP, *clear)
	}
	if err != nil {
		return admissionSetError(err)
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(c)
	}
	how := "its own"
	if c.Default {
		how = "the default"
	}
	fmt.Fprintf(e.stdout, "tenant %s: priorities up to %d (%s ceiling)\n", c.Tenant, c.MaxPriority, how)
	return nil
}

// admissionPriorityDirect is admission priority on shard 0 (ctx bounds it,
// connecting included): refusals are audited here, as the gateway's routes
// audit theirs.
func admissionPriorityDirect(ctx context.Context, e env, tenant string, setMax bool, maxP int, clear bool) (api.PriorityCeiling, error) {
	cfg, err := loadAdmissionEnv()
	if err != nil {
		return api.PriorityCeiling{}, err
	}
	shard0, err := openShardSet(ctx, cfg.Shards[:1], 1)
	if err != nil {
		return api.PriorityCeiling{}, err
	}
	defer shard0.Close()
	db := shard0.pools[0]
	if !setMax && !clear {
		ceilings, err := tenantcap.LoadCeilings(ctx, db)
		if err != nil {
			return api.PriorityCeiling{}, shard0.named(0, err)
		}
		return ceilings.Ceiling(tenant), nil
	}
	var c api.PriorityCeiling
	if setMax {
		c, err = tenantcap.SetCeiling(ctx, db, cliActor(), tenant, maxP)
	} else {
		c, err = tenantcap.ClearCeiling(ctx, db, cliActor(), tenant)
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		attempted, _ := json.Marshal(map[string]any{"tenant": tenant, "max_priority": maxP, "clear": clear})
		if aerr := tenantcap.RecordCeilingRefusal(ctx, db, cliActor(), attempted, ae); aerr != nil {
			fmt.Fprintf(e.stderr, "note: the refusal could not be audited: %v\n", aerr)
		}
	}
	if err != nil {
		return api.PriorityCeiling{}, shard0.named(0, err)
	}
	nc, nerr := natsconn.Connect(cfg.NATSURL, natsconn.Options{Name: "harvest admission priority", FailFast: true})
	if nerr == nil {
		defer nc.Close()
		if nerr = tenantcap.PublishCeilings(ctx, nc, cfg.Prefix, c); nerr == nil {
			nerr = nc.FlushTimeout(2 * time.Second)
		}
	}
	if nerr != nil {
		fmt.Fprintf(e.stderr, "note: change saved but not announced over NATS (%v); gateways apply it within HARVEST_ADMISSION_RELOAD (%s)\n",
			nerr, cfg.Reload)
	}
	return c, nil
}
