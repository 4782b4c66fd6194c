package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/harvest-run/harvest/internal/config"
	"github.com/harvest-run/harvest/internal/natsconn"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
	"github.com/harvest-run/harvest/pkg/dispatch"
	"github.com/harvest-run/harvest/pkg/weights"
)

// Exit codes of the commands that write every shard (weights, quotas).
const (
	exitPartial = 3 // some shards took the write: send it again
	exitCap     = 4 // a shard refused at the override cap
	exitNone    = 5 // no shard took the write (or answered the read)
)

// adminConfig is what the weights and quotas commands read.
type adminConfig struct {
	config.Common
	GatewayURL string `envconfig:"GATEWAY_URL" desc:"gateway base URL; when set, admin commands go through it"`
	Token      string `envconfig:"TOKEN" desc:"bearer token for HARVEST_GATEWAY_URL"`
}

// adminBackend is where the weights and quotas commands send requests:
// every shard of HARVEST_SHARDS directly (directBackend), or a gateway's
// HTTP routes through pkg/client when HARVEST_GATEWAY_URL is set
// (gatewayBackend, with HARVEST_TOKEN). Both give the same answers, so the
// commands print the same output and exit with the same codes.
type adminBackend interface {
	SetWeight(ctx context.Context, actor, queue, key string, w float64) (api.WeightWriteResult, error)
	ClearWeight(ctx context.Context, actor, queue, key string) (api.WeightWriteResult, error)
	GetWeights(ctx context.Context, queue string) (api.WeightReadResult, error)
	Keys(ctx context.Context, queue string, limit int) (api.KeysResult, error)
	SetQuota(ctx context.Context, actor, queue, quotaKey string, q api.Quota) (api.QuotaWriteResult, error)
	ClearQuota(ctx context.Context, actor, queue, quotaKey string) (api.QuotaWriteResult, error)
	GetQuota(ctx context.Context, queue, quotaKey string) (api.QuotaReadResult, error)
	PauseQueue(ctx context.Context, actor, queue string, paused bool) (api.QueuePauseResult, error)
	// Fairness sets the queue's fairness modes (req with a field given)
	// or reads them (req empty).
	Fairness(ctx context.Context, actor, queue string, req api.QueueFairnessRequest) (api.QueueFairnessResult, error)
	// GroupWeight sets (weight non-nil) or clears a group's weight.
	GroupWeight(ctx context.Context, actor, queue, group string, weight *float64) (api.GroupWeightResult, error)
	Close()
}

// openAdminBackend picks the backend from the environment.
func openAdminBackend(ctx context.Context, shardTimeout time.Duration, publish bool) (adminBackend, error) {
	var cfg adminConfig
	if err := config.Load(&cfg); err != nil {
		return nil, usageError{Msg: err.Error()}
	}
	if cfg.GatewayURL != "" {
		c, err := gatewayClient(cfg)
		if err != nil {
			return nil, err
		}
		return gatewayBackend{c}, nil
	}
	if err := cfg.Shards.Validate(); err != nil {
		return nil, usageError{Msg: err.Error()}
	}
	set, err := openShardSet(ctx, cfg.Shards, 2)
	if err != nil {
		return nil, err
	}
	b := &directBackend{set: set, opts: []weights.Option{weights.WithShardTimeout(shardTimeout)}}
	if publish && cfg.NATSURL != "" {
		// The change event is a hint: workers read weights at each claim,
		// so a NATS server that is not there costs nothing but the event.
		if nc, err := natsconn.Connect(cfg.NATSURL, natsconn.Options{Name: "harvest-cli", FailFast: true}, nats.Timeout(time.Second)); err == nil {
			b.nc = nc
			b.opts = append(b.opts, weights.WithNATS(nc, dispatch.Subjects{}))
		}
	}
	return b, nil
}

// directBackend writes and reads every shard itself.
type directBackend struct {
	set  *shardSet
	nc   *nats.Conn
	opts []weights.Option
}

func (b *directBackend) SetWeight(ctx context.Context, actor, queue, key string, w float64) (api.WeightWriteResult, error) {
	return weights.Set(ctx, b.set.Shards(), actor, queue, key, w, b.opts...)
}

func (b *directBackend) ClearWeight(ctx context.Context, actor, queue, key string) (api.WeightWriteResult, error) {
	return weights.Clear(ctx, b.set.Shards(), actor, queue, key, b.opts...)
}

func (b *directBackend) GetWeights(ctx context.Context, queue string) (api.WeightReadResult, error) {
	return weights.Get(ctx, b.set.Shards(), queue, b.opts...)
}

func (b *directBackend) Keys(ctx context.Context, queue string, limit int) (api.KeysResult, error) {
	return weights.Keys(ctx, b.set.Shards(), queue, limit, b.opts...)
}

func (b *directBackend) SetQuota(ctx context.Context, actor, queue, quotaKey string, q api.Quota) (api.QuotaWriteResult, error) {
	return weights.SetQuota(ctx, b.set.Shards(), actor, queue, quotaKey, q, b.opts...)
}

func (b *directBackend) ClearQuota(ctx context.Context, actor, queue, quotaKey string) (api.QuotaWriteResult, error) {
	return weights.ClearQuota(ctx, b.set.Shards(), actor, queue, quotaKey, b.opts...)
}

func (b *directBackend) GetQuota(ctx context.Context, queue, quotaKey string) (api.QuotaReadResult, error) {
	return weights.GetQuota(ctx, b.set.Shards(), queue, quotaKey, b.opts...)
}

func (b *directBackend) PauseQueue(ctx context.Context, actor, queue string, paused bool) (api.QueuePauseResult, error) {
	return weights.Pause(ctx, b.set.Shards(), actor, queue, paused, b.opts...)
}

func (b *directBackend) Fairness(ctx context.Context, actor, queue string, req api.QueueFairnessRequest) (api.QueueFairnessResult, error) {
	if req.TwoLevel == nil && req.Charge == nil {
		return weights.Fairness(ctx, b.set.Shards(), queue, b.opts...)
	}
	return weights.SetFairness(ctx, b.set.Shards(), actor, queue, req, b.opts...)
}

func (b *directBackend) GroupWeight(ctx context.Context, actor, queue, group string, weight *float64) (api.GroupWeightResult, error) {
	return weights.SetGroupWeight(ctx, b.set.Shards(), actor, queue, group, weight, b.opts...)
}

func (b *directBackend) Close() {
	if b.nc != nil {
		_ = b.nc.Flush()
		b.nc.Close()
	}
	b.set.Close()
}

// cliActor names the operator in audit rows: cli:<os user>.
func cliActor() string {
	name := ""
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	if name == "" {
		name = os.Getenv("USER")
	}
	if name == "" {
		name = "unknown"
	}
	return "cli:" + name
}

// statusError turns an answer's HTTP status into the command's exit code.
func statusError(status int, msg string) error {
	switch status {
	case http.StatusOK:
		return nil
	case http.StatusMultiStatus:
		return codedError{exitPartial, errors.New(msg)}
	case http.StatusConflict:
		return codedError{exitCap, errors.New(msg)}
	default:
		return codedError{exitNone, errors.New(msg)}
	}
}

// argError turns an invalid argument found by pkg/weights into a usage
// error naming the flag.
func argError(err error) error {
	var ae *api.Error
	if errors.As(err, &ae) && ae.Status == http.StatusBadRequest {
		return usageError{Msg: ae.Message}
	}
	return err
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func fmtWeight(w *float64) string {
	if w == nil {
		return "- (none: 1)"
	}
	return fmtFloat(*w)
}

func printOutcomes(w io.Writer, shards []api.ShardOutcome) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tOUTCOME\tMESSAGE")
	for _, s := range shards {
		fmt.Fprintf(tw, "%d\t%s\t%s\n", s.Shard, s.Outcome, s.Message)
	}
	tw.Flush()
}

// adminFlags are the flags every weights and quotas subcommand takes.
type adminFlags struct {
	queue   *string
	asJSON  *bool
	timeout *time.Duration
}

func addAdminFlags(fs *flag.FlagSet) adminFlags {
	return adminFlags{
		queue:   fs.String("queue", "", "the queue (required)"),
		asJSON:  fs.Bool("json", false, "print the answer as JSON (the body the HTTP route answers with)"),
		timeout: fs.Duration("timeout", weights.DefaultShardTimeout, "how long to wait for each shard"),
	}
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}

const weightsUsage = `weights <get|set|clear|keys> --queue Q [flags]

  get    --queue Q                       list the queue's overrides on every shard
  set    --queue Q --key K --weight W    set an override (0.001..1000) on every shard
  clear  --queue Q --key K               remove an override on every shard
  keys   --queue Q [--limit N]           per shard: each key's weight, pass, lag, pending, claims in the last minute

Writes go to every shard in HARVEST_SHARDS, or through the gateway at
HARVEST_GATEWAY_URL (with HARVEST_TOKEN) when it is set. Exit codes: 0 every shard,
3 only some shards (send the same command again), 4 refused at the cap of
1,000 overrides on some shard (clear one there first), 5 no shard,
2 bad usage.`

func runWeights(ctx context.Context, e env, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprintln(e.stdout, "usage: harvest "+weightsUsage)
			return flag.ErrHelp
		}
		return usageError{Msg: "usage: harvest " + weightsUsage}
	}
	sub, args := args[0], args[1:]
	fs := newFlags(e, "weights "+sub, weightsUsage)
	af := addAdminFlags(fs)
	var key *string
	var weight *float64
	var limit *int
	switch sub {
	case "get":
	case "set":
		key = fs.String("key", "", "the fairness key (required)")
		weight = fs.Float64("weight", 0, "the weight, 0.001 to 1000 (required)")
	case "clear":
		key = fs.String("key", "", "the fairness key (required)")
	case "keys":
		limit = fs.Int("limit", weights.DefaultKeyLimit, "most keys listed per shard")
	default:
		return usageError{Msg: fmt.Sprintf("unknown subcommand %q: want get, set, clear or keys", sub)}
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *af.queue == "" {
		return usageError{Msg: "--queue is required"}
	}
	if key != nil && !flagSet(fs, "key") {
		return usageError{Msg: "--key is required"}
	}
	if weight != nil && !flagSet(fs, "weight") {
		return usageError{Msg: "--weight is required"}
	}
	// Check the arguments before touching any shard.
	if err := weights.ValidateQueue(*af.queue); err != nil {
		return argError(err)
	}
	if key != nil {
		if err := weights.ValidateOverrideKey(*key); err != nil {
			return argError(err)
		}
	}
	if weight != nil {
		if err := weights.ValidateWeight(*weight); err != nil {
			return argError(err)
		}
	}
	if limit != nil {
		if err := weights.ValidateLimit(*limit); err != nil {
			return argError(err)
		}
	}

	b, err := openAdminBackend(ctx, *af.timeout, sub == "set" || sub == "clear")
	if err != nil {
		return err
	}
	defer b.Close()
	actor := cliActor()

	switch sub {
	case "set", "clear":
		var res api.WeightWriteResult
		if sub == "set" {
			res, err = b.SetWeight(ctx, actor, *af.queue, *key, *weight)
		} else {
			res, err = b.ClearWeight(ctx, actor, *af.queue, *key)
		}
		if err != nil {
			return argError(err)
		}
		if *af.asJSON {
			if err := writeJSON(e.stdout, res); err != nil {
				return err
			}
		} else {
			if sub == "set" {
				fmt.Fprintf(e.stdout, "set weight of key %q in queue %q to %s\n", res.Key, res.Queue, fmtFloat(*weight))
			} else {
				fmt.Fprintf(e.stdout, "cleared the weight of key %q in queue %q (it weighs 1)\n", res.Key, res.Queue)
			}
			printOutcomes(e.stdout, res.Shards)
			fmt.Fprintln(e.stdout, res.Message)
		}
		return statusError(res.Status(), res.Message)

	case "get":
		res, err := b.GetWeights(ctx, *af.queue)
		if err != nil {
			return argError(err)
		}
		if *af.asJSON {
			if err := writeJSON(e.stdout, res); err != nil {
				return err
			}
		} else {
			printWeights(e.stdout, res)
		}
		return readStatus(res.Status(), len(res.UnavailableShards), res.Message)

	case "keys":
		res, err := b.Keys(ctx, *af.queue, *limit)
		if err != nil {
			return argError(err)
		}
		if *af.asJSON {
			if err := writeJSON(e.stdout, res); err != nil {
				return err
			}
		} else {
			printKeys(e.stdout, res)
		}
		msg := ""
		if len(res.UnavailableShards) > 0 {
			msg = fmt.Sprintf("shards not answering: %s", ints(res.UnavailableShards))
		}
		return readStatus(res.Status(), len(res.UnavailableShards), msg)
	}
	return nil
}

// readStatus is the exit code of a read: 0 when every shard answered, 3
// when some did not, 5 when none did.
func readStatus(status, unavailable int, msg string) error {
	switch {
	case status != http.StatusOK:
		return codedError{exitNone, errors.New(nonEmpty(msg, "no shard answered"))}
	case unavailable > 0:
		return codedError{exitPartial, errors.New(nonEmpty(msg, "some shards did not answer"))}
	}
	return nil
}

func nonEmpty(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func ints(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}

func printWeights(w io.Writer, res api.WeightReadResult) {
	fmt.Fprintf(w, "queue %q: %d overrides", res.Queue, len(res.Overrides))
	if res.WeightsUniform {
		fmt.Fprintln(w, ", the same on every shard that answered (other keys weigh 1)")
	} else {
		fmt.Fprintln(w, " agreed by every shard that answered; THE SHARDS DISAGREE on others (below)")
	}
	if len(res.Overrides) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tWEIGHT")
		for _, o := range res.Overrides {
			fmt.Fprintf(tw, "%q\t%s\n", o.Key, fmtFloat(o.Weight))
		}
		tw.Flush()
	}
	if !res.WeightsUniform {
		fmt.Fprintln(w, "\nkeys in dispute:")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SHARD\tKEY\tWEIGHT")
		for _, s := range res.Shards {
			for _, d := range s.Differing {
				fmt.Fprintf(tw, "%d\t%q\t%s\n", s.Shard, d.Key, fmtWeight(d.Weight))
			}
		}
		tw.Flush()
	}
	for _, s := range res.Shards {
		if s.Outcome != api.ShardOutcomeOK {
			fmt.Fprintf(w, "shard %d: %s: %s\n", s.Shard, s.Outcome, s.Message)
		}
	}
	if res.Message != "" {
		fmt.Fprintln(w, res.Message)
	}
}

func printKeys(w io.Writer, res api.KeysResult) {
	for i, s := range res.Shards {
		if i > 0 {
			fmt.Fprintln(w)
		}
		if s.Outcome != api.ShardOutcomeOK {
			fmt.Fprintf(w, "shard %d: %s: %s\n", s.Shard, s.Outcome, s.Message)
			continue
		}
		fmt.Fprintf(w, "shard %d: queue %q, clock %s, %d keys", s.Shard, res.Queue, fmtFloat(s.Clock), len(s.Keys))
		if s.Truncated {
			fmt.Fprint(w, " (more not shown: raise --limit)")
		}
		fmt.Fprintln(w)
		if s.Paused != nil {
			fmt.Fprintf(w, "PAUSED by %s since %s: workers claim nothing from this queue here (harvest queues resume)\n",
				s.Paused.By, s.Paused.At.UTC().Format(time.RFC3339))
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tWEIGHT\tPASS\tLAG\tPENDING\tCLAIMS/MIN")
		for _, k := range s.Keys {
			pass := "-"
			if k.Pass != nil {
				pass = strconv.FormatFloat(*k.Pass, 'f', 3, 64)
			}
			wt := fmtFloat(k.Weight)
			if k.Overridden {
				wt += "*"
			}
			fmt.Fprintf(tw, "%q\t%s\t%s\t%s\t%d\t%d\n", k.Key, wt, pass,
				strconv.FormatFloat(k.Lag, 'f', 3, 64), k.Pending, k.ClaimsLastMinute)
		}
		tw.Flush()
	}
}

// gatewayClient makes the pkg/client client of HARVEST_GATEWAY_URL with
// HARVEST_TOKEN; both are required together.
func gatewayClient(cfg adminConfig) (*client.Client, error) {
	if cfg.Token == "" {
		return nil, usageError{Msg: "HARVEST_GATEWAY_URL is set but HARVEST_TOKEN is not: the gateway needs a bearer token"}
	}
	c, err := client.New(client.Options{URL: cfg.GatewayURL, Token: cfg.Token, HTTPClient: &http.Client{}})
	if err != nil {
		return nil, usageError{Msg: "HARVEST_GATEWAY_URL: " + err.Error()}
	}
	return c, nil
}

// loadGateway reads HARVEST_GATEWAY_URL and HARVEST_TOKEN; the client is
// nil when no gateway is configured.
func loadGateway() (*client.Client, error) {
	var cfg adminConfig
	if err := config.Load(&cfg); err != nil {
		return nil, usageError{Msg: err.Error()}
	}
	if cfg.GatewayURL == "" {
		return nil, nil
	}
	return gatewayClient(cfg)
}

// gatewayBackend sends the weights and quotas commands to a gateway. The
// actor of the audit rows is the token's name there, so the actor
// argument is not sent.
type gatewayBackend struct{ c *client.Client }

func (b gatewayBackend) SetWeight(ctx context.Context, _, queue, key string, w float64) (api.WeightWriteResult, error) {
	return b.c.SetWeight(ctx, queue, key, w)
}

func (b gatewayBackend) ClearWeight(ctx context.Context, _, queue, key string) (api.WeightWriteResult, error) {
	return b.c.ClearWeight(ctx, queue, key)
}

func (b gatewayBackend) GetWeights(ctx context.Context, queue string) (api.WeightReadResult, error) {
	return b.c.GetWeights(ctx, queue)
}

func (b gatewayBackend) Fairness(ctx context.Context, _, queue string, req api.QueueFairnessRequest) (api.QueueFairnessResult, error) {
	if req.TwoLevel == nil && req.Charge == nil {
		return b.c.QueueFairness(ctx, queue)
	}
	return b.c.SetQueueFairness(ctx, queue, req)
}

func (b gatewayBackend) GroupWeight(ctx context.Context, _, queue, group string, weight *float64) (api.GroupWeightResult, error) {
	if weight == nil {
		return b.c.ClearGroupWeight(ctx, queue, group)
	}
	return b.c.SetGroupWeight(ctx, queue, group, *weight)
}

func (b gatewayBackend) PauseQueue(ctx context.Context, _, queue string, paused bool) (api.QueuePauseResult, error) {
	if paused {
		return b.c.PauseQueue(ctx, queue)
	}
	return b.c.ResumeQueue(ctx, queue)
}

func (b gatewayBackend) Keys(ctx context.Context, queue string, limit int) (api.KeysResult, error) {
	return b.c.Keys(ctx, queue, limit)
}

func (b gatewayBackend) SetQuota(ctx context.Context, _, queue, quotaKey string, q api.Quota) (api.QuotaWriteResult, error) {
	return b.c.SetQuota(ctx, queue, quotaKey, q)
}

func (b gatewayBackend) ClearQuota(ctx context.Context, _, queue, quotaKey string) (api.QuotaWriteResult, error) {
	return b.c.ClearQuota(ctx, queue, quotaKey)
}

func (b gatewayBackend) GetQuota(ctx context.Context, queue, quotaKey string) (api.QuotaReadResult, error) {
	return b.c.GetQuota(ctx, queue, quotaKey)
}

func (gatewayBackend) Close() {}
