package cli

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/weights"
)

const queuesUsage = `queues <pause|resume|fairness|group-weight> --queue Q [--json] [--timeout 10s]

  pause   --queue Q    workers stop claiming the queue's tasks on every shard;
                       starts are still accepted and wait
  resume  --queue Q    workers claim the queue again (they are woken at once)
  fairness --queue Q [--two-level=true|false] [--charge claims|runtime]
                       shows the queue's fairness modes on every shard, or
                       sets those given (docs/fairness.md)
  group-weight --queue Q --group G (--weight W | --clear)
                       sets or clears the weight of tenant group G in a
                       two-level queue (a group without one weighs 1)

When pause exits 0, no claim is still taking the queue's tasks on any shard.
All are audited and idempotent. They go to every shard in HARVEST_SHARDS, or
through the gateway at HARVEST_GATEWAY_URL (with HARVEST_TOKEN, which needs
weights:write) when it is set. 'harvest weights keys --queue Q' shows the
pause. Exit codes: 0 every shard, 3 only some shards (send the same command
again), 5 no shard, 2 bad usage.`

func runQueues(ctx context.Context, e env, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			fmt.Fprintln(e.stdout, "usage: harvest "+queuesUsage)
			return flag.ErrHelp
		}
		return usageError{Msg: "usage: harvest " + queuesUsage}
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "pause", "resume", "fairness", "group-weight":
	default:
		return usageError{Msg: fmt.Sprintf("unknown subcommand %q: want pause, resume, fairness or group-weight", sub)}
	}
	fs := newFlags(e, "queues "+sub, queuesUsage)
	af := addAdminFlags(fs)
	var twoLevel, charge, group *string
	var weight *float64
	var clear *bool
	switch sub {
	case "fairness":
		twoLevel = fs.String("two-level", "", "true or false: share the queue among tenants first, then their keys")
		charge = fs.String("charge", "", "claims (1 per claim) or runtime (the seconds a task holds a worker)")
	case "group-weight":
		group = fs.String("group", "", "the group: the tenant part of the keys, before the first /")
		weight = fs.Float64("weight", 0, "the group's weight: a positive finite number")
		clear = fs.Bool("clear", false, "clear the group's weight (it weighs 1 again)")
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch sub {
	case "fairness":
		return runQueueFairness(ctx, e, af, fs, *twoLevel, *charge)
	case "group-weight":
		return runGroupWeight(ctx, e, af, fs, *group, *weight, *clear)
	}
	if *af.queue == "" {
		return usageError{Msg: "--queue is required"}
	}
	if err := weights.ValidateQueue(*af.queue); err != nil {
		return argError(err)
	}
	b, err := openAdminBackend(ctx, *af.timeout, true)
	if err != nil {
		return err
	}
	defer b.Close()
	res, err := b.PauseQueue(ctx, cliActor(), *af.queue, sub == "pause")
	if err != nil {
		return argError(err)
	}
	return writeChange(e, *af.asJSON, res, func() { printPause(e, res) }, res.Status(), res.UnavailableShards, len(res.Shards))
}

// writeChange prints the result of a change sent to every shard (as JSON
// with --json, else by print) and turns its status into the exit code:
// every shard took it, some did (send it again), or none did.
func writeChange(e env, asJSON bool, res any, print func(), status int, unavailable []int, shards int) error {
	if asJSON {
		if err := writeJSON(e.stdout, res); err != nil {
			return err
		}
	} else {
		print()
	}
	msg := "no shard took it, nothing changed: send the same command again when the shards are back"
	if len(unavailable) < shards {
		msg = fmt.Sprintf("shards %s did not take it: send the same command again", ints(unavailable))
	}
	return statusError(status, msg)
}

func printPause(e env, res api.QueuePauseResult) {
	verb := "resumed"
	if res.Paused {
		verb = "paused"
	}
	fmt.Fprintf(e.stdout, "queue %q %s\n", res.Queue, verb)
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tOUTCOME\tSTATE\tMESSAGE")
	for _, s := range res.Shards {
		state := "-"
		switch {
		case s.Outcome != api.ShardOutcomeOK:
		case s.Paused != nil:
			state = fmt.Sprintf("paused by %s since %s", s.Paused.By, s.Paused.At.UTC().Format(time.RFC3339))
		default:
			state = "running"
		}
		note := s.Message
		if s.Outcome == api.ShardOutcomeOK && !s.Changed {
			note = "unchanged (it was " + verb + " already)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", s.Shard, s.Outcome, state, note)
	}
	tw.Flush()
}

// runQueueFairness is 'harvest queues fairness': a read without
// --two-level and --charge, else a change of those given.
func runQueueFairness(ctx context.Context, e env, af adminFlags, fs *flag.FlagSet, twoLevel, charge string) error {
	if *af.queue == "" {
		return usageError{Msg: "--queue is required"}
	}
	if err := weights.ValidateQueue(*af.queue); err != nil {
		return argError(err)
	}
	var req api.QueueFairnessRequest
	if flagSet(fs, "two-level") {
		on, err := strconv.ParseBool(twoLevel)
		if err != nil {
			return usageError{Msg: fmt.Sprintf("--two-level must be true or false, not %q", twoLevel)}
		}
		req.TwoLevel = &on
	}
	if flagSet(fs, "charge") {
		req.Charge = &charge
		if err := weights.ValidateFairness(req); err != nil {
			return argError(err)
		}
	}
	write := req.TwoLevel != nil || req.Charge != nil
	b, err := openAdminBackend(ctx, *af.timeout, false)
	if err != nil {
		return err
	}
	defer b.Close()
	res, err := b.Fairness(ctx, cliActor(), *af.queue, req)
	if err != nil {
		return argError(err)
	}
	if *af.asJSON {
		if err := writeJSON(e.stdout, res); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SHARD\tOUTCOME\tTWO-LEVEL\tCHARGE\tCHANGED BY\tMESSAGE")
		for _, s := range res.Shards {
			if s.Outcome != api.ShardOutcomeOK {
				fmt.Fprintf(tw, "%d\t%s\t-\t-\t-\t%s\n", s.Shard, s.Outcome, s.Message)
				continue
			}
			by := "-"
			if s.Fairness.UpdatedAt != nil {
				by = s.Fairness.UpdatedBy + " at " + s.Fairness.UpdatedAt.UTC().Format(time.RFC3339)
			}
			note := ""
			if write && !s.Changed {
				note = "unchanged"
			}
			fmt.Fprintf(tw, "%d\t%s\t%v\t%s\t%s\t%s\n", s.Shard, s.Outcome, s.Fairness.TwoLevel, s.Fairness.Charge, by, note)
		}
		tw.Flush()
		printGroupWeights(e, res)
	}
	msg := "no shard answered: try again when the shards are back"
	if len(res.UnavailableShards) < len(res.Shards) {
		msg = fmt.Sprintf("shards %s did not answer: send the same command again", ints(res.UnavailableShards))
	}
	return statusError(res.Status(), msg)
}

// printGroupWeights lists the group weights of a read, once when every
// shard that answered holds the same ones, else per shard.
func printGroupWeights(e env, res api.QueueFairnessResult) {
	seen := map[string][]int{}
	var order []string
	for _, s := range res.Shards {
		if s.Outcome != api.ShardOutcomeOK {
			continue
		}
		parts := make([]string, len(s.Fairness.GroupWeights))
		for i, g := range s.Fairness.GroupWeights {
			parts[i] = g.Group + "=" + strconv.FormatFloat(g.Weight, 'g', -1, 64)
		}
		line := strings.Join(parts, " ")
		if _, ok := seen[line]; !ok {
			order = append(order, line)
		}
		seen[line] = append(seen[line], s.Shard)
	}
	for _, line := range order {
		text := line
		if text == "" {
			text = "none (every group weighs 1)"
		}
		if len(order) == 1 {
			fmt.Fprintf(e.stdout, "group weights: %s\n", text)
			continue
		}
		fmt.Fprintf(e.stdout, "group weights on shards %s: %s\n", ints(seen[line]), text)
	}
}

// runGroupWeight is 'harvest queues group-weight': a set with --weight,
// a clear with --clear.
func runGroupWeight(ctx context.Context, e env, af adminFlags, fs *flag.FlagSet, group string, weight float64, clear bool) error {
	switch {
	case *af.queue == "":
		return usageError{Msg: "--queue is required"}
	case group == "":
		return usageError{Msg: "--group is required"}
	case clear == flagSet(fs, "weight"):
		return usageError{Msg: "give --weight W or --clear, not both"}
	}
	if err := weights.ValidateQueue(*af.queue); err != nil {
		return argError(err)
	}
	if err := weights.ValidateGroup(group); err != nil {
		return argError(err)
	}
	var w *float64
	if !clear {
		if err := weights.ValidateWeight(weight); err != nil {
			return argError(err)
		}
		w = &weight
	}
	b, err := openAdminBackend(ctx, *af.timeout, false)
	if err != nil {
		return err
	}
	defer b.Close()
	res, err := b.GroupWeight(ctx, cliActor(), *af.queue, group, w)
	if err != nil {
		return argError(err)
	}
	return writeChange(e, *af.asJSON, res, func() { printGroupWeight(e, res, w) }, res.Status(), res.UnavailableShards, len(res.Shards))
}

func printGroupWeight(e env, res api.GroupWeightResult, w *float64) {
	what := "cleared (it weighs 1)"
	if w != nil {
		what = "set to " + strconv.FormatFloat(*w, 'g', -1, 64)
	}
	fmt.Fprintf(e.stdout, "group %q of queue %q: weight %s\n", res.Group, res.Queue, what)
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tOUTCOME\tOLD WEIGHT\tMESSAGE")
	for _, s := range res.Shards {
		old := "-"
		if s.OldWeight != nil {
			old = strconv.FormatFloat(*s.OldWeight, 'g', -1, 64)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", s.Shard, s.Outcome, old, s.Message)
	}
	tw.Flush()
}
