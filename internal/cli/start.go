package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/harvest-run/harvest/pkg/client"
)

const startUsage = `start [flags] WORKFLOW [INPUT-JSON]

Starts a run of WORKFLOW through the gateway at HARVEST_GATEWAY_URL with the
token in HARVEST_TOKEN, and prints it. INPUT-JSON is the run's input (any
JSON; none when absent). With --wait it also waits for the run to be final.
Exit status: 0 started (or replayed), 1 refused or failed, 2 bad usage.

Flags:`

func runStart(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "start", startUsage)
	queue := fs.String("queue", "default", "queue of the run")
	id := fs.String("id", "", "run id (idempotency key); the gateway makes one when empty")
	key := fs.String("key", "", "fairness key (empty: the default key, or the tenant's own when the gateway binds keys)")
	quotaKey := fs.String("quota-key", "", "quota key (empty: the fairness key)")
	priority := fs.Int("priority", 0, "priority, -1000 to 1000, higher first")
	delay := fs.Duration("delay", 0, "start the run this much later")
	timeout := fs.Duration("timeout", 0, "time limit of one attempt (0: none)")
	maxAttempts := fs.Int("max-attempts", 0, "attempts before the run fails (0: the gateway's default)")
	wait := fs.Duration("wait", 0, "then wait up to this long for the run to be final")
	notify := fs.Bool("notify", false, "publish the run's final state on NATS (harvest.runs.<tenant>.<run_id>)")
	asJSON := fs.Bool("json", false, "print the run resource as JSON")
	var pos []string
	rest := args
	for {
		p, r := splitPositional(rest)
		if p == "" {
			break
		}
		pos = append(pos, p)
		rest = r
	}
	if err := parseFlags(fs, rest); err != nil {
		return err
	}
	if len(pos) == 0 || len(pos) > 2 {
		fs.Usage()
		return usageError{Msg: "give WORKFLOW and, optionally, INPUT-JSON"}
	}
	var input any
	if len(pos) == 2 {
		if !json.Valid([]byte(pos[1])) {
			return usageError{Msg: fmt.Sprintf("INPUT-JSON %q is not valid JSON", pos[1])}
		}
		input = json.RawMessage(pos[1])
	}
	c, err := runsClient()
	if err != nil {
		return err
	}
	o := client.StartOptions{ID: *id, FairnessKey: *key, QuotaKey: *quotaKey, Priority: *priority,
		Delay: *delay, Timeout: *timeout, MaxAttempts: *maxAttempts, Notify: *notify}
	st, err := c.Start(ctx, pos[0], *queue, input, o)
	if err != nil {
		return apiFailure(err)
	}
	run := st.Run
	if !*asJSON {
		verb := "started"
		if !st.Created {
			verb = "replayed (a run with this id and request exists)"
		}
		fmt.Fprintf(e.stderr, "%s %s\n", verb, run.ID)
	}
	if *wait > 0 {
		wctx, cancel := context.WithTimeout(ctx, *wait+10*time.Second)
		defer cancel()
		if run, err = c.Wait(wctx, run.ID, *wait); err != nil {
			return apiFailure(err)
		}
	}
	return printRun(e, run, *asJSON)
}
