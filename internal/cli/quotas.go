package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/weights"
)

const quotasUsage = `quotas <get|set|clear> --queue Q [--quota-key K] [flags]

  get    --queue Q [--quota-key K]            list the queue's quotas (or one) on every shard
  set    --queue Q --quota-key K [--max-concurrent N] [--rate R --burst B]
                                              replace a quota on every shard: a limit left out is removed
  clear  --queue Q --quota-key K              remove a quota (both limits) on every shard

A quota is checked after each claim of a task with that quota key: at most
max-concurrent of its tasks run at once, and claims draw from a token bucket
that refills at rate per second up to burst. With HARVEST_GATEWAY_URL (and
HARVEST_TOKEN) set, the command goes through that gateway. Exit codes: 0 every shard,
3 only some shards (send the same command again), 5 no shard, 2 bad usage.`

func runQuotas(ctx context.Context, e env, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprintln(e.stdout, "usage: harvest "+quotasUsage)
			return flag.ErrHelp
		}
		return usageError{Msg: "usage: harvest " + quotasUsage}
	}
	sub, args := args[0], args[1:]
	fs := newFlags(e, "quotas "+sub, quotasUsage)
	af := addAdminFlags(fs)
	quotaKey := fs.String("quota-key", "", "the quota key")
	var maxConc *int
	var rate, burst *float64
	switch sub {
	case "get", "clear":
	case "set":
		maxConc = fs.Int("max-concurrent", 0, "most tasks of the quota key running at once")
		rate = fs.Float64("rate", 0, "claims per second (with --burst)")
		burst = fs.Float64("burst", 0, "token bucket size, at least 1 (with --rate)")
	default:
		return usageError{Msg: fmt.Sprintf("unknown subcommand %q: want get, set or clear", sub)}
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *af.queue == "" {
		return usageError{Msg: "--queue is required"}
	}
	if sub != "get" && *quotaKey == "" {
		return usageError{Msg: "--quota-key is required"}
	}
	if err := weights.ValidateQueue(*af.queue); err != nil {
		return argError(err)
	}
	if *quotaKey != "" {
		if err := weights.ValidateQuotaKey(*quotaKey); err != nil {
			return argError(err)
		}
	}
	var q api.Quota
	if sub == "set" {
		if flagSet(fs, "max-concurrent") {
			q.MaxConcurrent = maxConc
		}
		if flagSet(fs, "rate") {
			q.Rate = rate
		}
		if flagSet(fs, "burst") {
			q.Burst = burst
		}
		if err := q.Validate(); err != nil {
			return usageError{Msg: strings.ReplaceAll(argError(err).Error(), "_", "-")}
		}
	}

	b, err := openAdminBackend(ctx, *af.timeout, sub != "get")
	if err != nil {
		return err
	}
	defer b.Close()
	actor := cliActor()

	if sub == "get" {
		res, err := b.GetQuota(ctx, *af.queue, *quotaKey)
		if err != nil {
			return argError(err)
		}
		if *af.asJSON {
			if err := writeJSON(e.stdout, res); err != nil {
				return err
			}
		} else {
			printQuotas(e.stdout, res)
		}
		return readStatus(res.Status(), len(res.UnavailableShards), res.Message)
	}

	var res api.QuotaWriteResult
	if sub == "set" {
		res, err = b.SetQuota(ctx, actor, *af.queue, *quotaKey, q)
	} else {
		res, err = b.ClearQuota(ctx, actor, *af.queue, *quotaKey)
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
			fmt.Fprintf(e.stdout, "set quota %q of queue %q: %s\n", res.QuotaKey, res.Queue, describeQuota(q))
		} else {
			fmt.Fprintf(e.stdout, "cleared quota %q of queue %q (no limits)\n", res.QuotaKey, res.Queue)
		}
		printOutcomes(e.stdout, res.Shards)
		fmt.Fprintln(e.stdout, res.Message)
	}
	return statusError(res.Status(), res.Message)
}

func describeQuota(q api.Quota) string {
	var parts []string
	if q.MaxConcurrent != nil {
		parts = append(parts, "max_concurrent "+strconv.Itoa(*q.MaxConcurrent))
	}
	if q.Rate != nil {
		parts = append(parts, fmt.Sprintf("rate %s/s burst %s", fmtFloat(*q.Rate), fmtFloat(*q.Burst)))
	}
	if len(parts) == 0 {
		return "no limits"
	}
	return strings.Join(parts, ", ")
}

func printQuotaRows(w io.Writer, shard string, rows []api.QuotaEntry) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if shard != "" {
		fmt.Fprint(tw, "SHARD\t")
	}
	fmt.Fprintln(tw, "QUOTA KEY\tMAX CONCURRENT\tRATE/S\tBURST")
	for _, r := range rows {
		if shard != "" {
			fmt.Fprintf(tw, "%s\t", shard)
		}
		mc, rt, bu := "-", "-", "-"
		if r.MaxConcurrent != nil {
			mc = strconv.Itoa(*r.MaxConcurrent)
		}
		if r.Rate != nil {
			rt = fmtFloat(*r.Rate)
		}
		if r.Burst != nil {
			bu = fmtFloat(*r.Burst)
		}
		fmt.Fprintf(tw, "%q\t%s\t%s\t%s\n", r.QuotaKey, mc, rt, bu)
	}
	tw.Flush()
}

func printQuotas(w io.Writer, res api.QuotaReadResult) {
	fmt.Fprintf(w, "queue %q: %d quotas", res.Queue, len(res.Quotas))
	if res.QuotasUniform {
		fmt.Fprintln(w, ", the same on every shard that answered")
	} else {
		fmt.Fprintln(w, " agreed by every shard that answered; THE SHARDS DISAGREE on others (below)")
	}
	if len(res.Quotas) > 0 {
		printQuotaRows(w, "", res.Quotas)
	}
	if !res.QuotasUniform {
		fmt.Fprintln(w, "\nquotas in dispute:")
		for _, s := range res.Shards {
			if s.Outcome == api.ShardOutcomeOK {
				printQuotaRows(w, strconv.Itoa(s.Shard), s.Quotas)
			}
		}
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
