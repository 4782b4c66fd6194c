package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kelseyhightower/envconfig"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
)

// gatewayEnv is how the commands that go through a gateway (start, runs,
// demo) find it.
type gatewayEnv struct {
	GatewayURL string `envconfig:"GATEWAY_URL" desc:"harvest start, runs, demo: base URL of a gateway, such as http://127.0.0.1:8080"`
	Token      string `envconfig:"TOKEN" desc:"harvest start, runs: bearer secret sent to the gateway"`
}

// runsClient makes a client from HARVEST_GATEWAY_URL and HARVEST_TOKEN.
func runsClient() (*client.Client, error) {
	var g gatewayEnv
	if err := envconfig.Process("HARVEST", &g); err != nil {
		return nil, usageError{Msg: err.Error()}
	}
	if g.GatewayURL == "" {
		return nil, usageError{Msg: "HARVEST_GATEWAY_URL is not set: name a gateway, such as http://127.0.0.1:8080 (harvest dev prints it)"}
	}
	if g.Token == "" {
		return nil, usageError{Msg: "HARVEST_TOKEN is not set: give the bearer secret of a token (harvest dev prints tenant tokens)"}
	}
	c, err := client.New(client.Options{URL: g.GatewayURL, Token: g.Token})
	if err != nil {
		return nil, usageError{Msg: "HARVEST_GATEWAY_URL: " + err.Error()}
	}
	return c, nil
}

const runsUsage = `runs get ID [--wait 30s] [--json]
       harvest runs list [--status queued,running] [--queue Q] [--name WORKFLOW] [--limit 50] [--cursor C] [--json]
       harvest runs cancel ID [--json]
       harvest runs retry ID [--json]

Reads, lists or cancels the runs of the tenant of the token in HARVEST_TOKEN
through the gateway at HARVEST_GATEWAY_URL.

  get     prints a run; --wait waits until it is final or the time is up.
  list    prints a page of runs, newest first, as a table, then the cursor
          of the next page (pass it as --cursor); --json prints the page.
  cancel  cancels a run that is not final yet and prints it.
  retry   puts a failed or cancelled run back in its queue and prints it:
          its attempts are kept and counted on, its last step runs again
          with a fresh budget of attempts, and it takes an admission slot
          as a start does.

Exit status: 0 done (whatever the run's status), 1 error, 2 bad usage.`

func runRuns(ctx context.Context, e env, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		if len(args) == 0 {
			fmt.Fprintln(e.stderr, "usage: harvest "+runsUsage)
			return usageError{Msg: "name a subcommand: get, list, cancel or retry"}
		}
		fmt.Fprintln(e.stdout, "usage: harvest "+runsUsage)
		return nil
	}
	switch args[0] {
	case "get":
		return runsGet(ctx, e, args[1:])
	case "list":
		return runsList(ctx, e, args[1:])
	case "cancel":
		return runsCancel(ctx, e, args[1:])
	case "retry":
		return runsRetry(ctx, e, args[1:])
	}
	return usageError{Msg: fmt.Sprintf("unknown runs command %q (want get, list, cancel or retry)", args[0])}
}

func runsGet(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "runs get", runsUsage)
	wait := fs.Duration("wait", 0, "wait up to this long for the run to be final")
	asJSON := fs.Bool("json", false, "print the run resource as JSON")
	id, rest := splitPositional(args)
	if err := parseFlags(fs, rest); err != nil {
		return err
	}
	if id == "" {
		return usageError{Msg: "usage: harvest runs get ID [--wait 30s] [--json]"}
	}
	c, err := runsClient()
	if err != nil {
		return err
	}
	var run api.Run
	if *wait > 0 {
		run, err = c.Wait(ctx, id, *wait)
	} else {
		run, err = c.Get(ctx, id)
	}
	if err != nil {
		return apiFailure(err)
	}
	return printRun(e, run, *asJSON)
}

// parseStatuses reads --status: a comma-separated list of run statuses,
// checked here so that a typo is a usage error rather than a 400.
func parseStatuses(v string) ([]api.Status, error) {
	if v == "" {
		return nil, nil
	}
	var out []api.Status
	for _, p := range strings.Split(v, ",") {
		s, err := api.ParseStatus(strings.TrimSpace(p))
		if err != nil {
			return nil, usageError{Msg: fmt.Sprintf("--status: %v; want a comma-separated list", err)}
		}
		out = append(out, s)
	}
	return out, nil
}

func runsList(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "runs list", runsUsage)
	status := fs.String("status", "", "only runs in these statuses, comma-separated (queued,running,...)")
	queue := fs.String("queue", "", "only runs of this queue")
	name := fs.String("name", "", "only runs of this workflow")
	limit := fs.Int("limit", 0, "runs in the page (0: the gateway's default)")
	cursor := fs.String("cursor", "", "the next-page cursor a previous list printed")
	asJSON := fs.Bool("json", false, "print the page as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	statuses, err := parseStatuses(*status)
	if err != nil {
		return err
	}
	if *limit < 0 {
		return usageError{Msg: fmt.Sprintf("--limit %d: want 0 or more", *limit)}
	}
	c, err := runsClient()
	if err != nil {
		return err
	}
	page, err := c.List(ctx, client.ListOptions{Statuses: statuses, Queue: *queue, Name: *name,
		Limit: *limit, Cursor: *cursor})
	if err != nil {
		return apiFailure(err)
	}
	if *asJSON {
		return printJSON(e, page)
	}
	// The next page's command repeats the filters: a cursor continues a
	// listing only with the filters that made it.
	var again []string
	for _, f := range []struct{ flag, v string }{{"--status", *status}, {"--queue", *queue}, {"--name", *name}} {
		if f.v != "" {
			again = append(again, f.flag, shellWord(f.v))
		}
	}
	if *limit > 0 {
		again = append(again, "--limit", strconv.Itoa(*limit))
	}
	printRunTable(e.stdout, page, again)
	return nil
}

// printRunTable writes a page as a table, then the command for the next
// page when there is one (flags, then its cursor), so that a person can
// page through without --json. A filtered page can hold no runs and still
// have a next page: it read as far as a page reads (docs/api.md).
func printRunTable(w io.Writer, page api.RunList, flags []string) {
	tw := tabwriter.NewWriter(w, 1, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATUS\tQUEUE\tNAME\tCREATED")
	for _, r := range page.Runs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.ID, r.Status, r.Queue, r.Name, r.CreatedAt.Format(time.RFC3339))
	}
	_ = tw.Flush()
	if page.NextCursor != "" {
		if len(page.Runs) == 0 {
			fmt.Fprintln(w, "(none in this stretch of the history; older runs are on the next page)")
		}
		cmd := append(append([]string{"harvest", "runs", "list"}, flags...), "--cursor", page.NextCursor)
		fmt.Fprintf(w, "\nnext page: %s\n", strings.Join(cmd, " "))
	}
}

// shellWord is v as one word of a POSIX shell command: as it is when it
// holds only characters no shell treats specially, else single-quoted.
func shellWord(v string) string {
	safe := v != "" && strings.IndexFunc(v, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.,:/@+=", r))
	}) < 0
	if safe {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}

func runsCancel(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "runs cancel", runsUsage)
	asJSON := fs.Bool("json", false, "print the run resource as JSON")
	id, rest := splitPositional(args)
	if err := parseFlags(fs, rest); err != nil {
		return err
	}
	if id == "" {
		return usageError{Msg: "usage: harvest runs cancel ID [--json]"}
	}
	c, err := runsClient()
	if err != nil {
		return err
	}
	run, err := c.Cancel(ctx, id)
	if err != nil {
		return apiFailure(err)
	}
	return printRun(e, run, *asJSON)
}

func runsRetry(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "runs retry", runsUsage)
	asJSON := fs.Bool("json", false, "print the run resource as JSON")
	id, rest := splitPositional(args)
	if err := parseFlags(fs, rest); err != nil {
		return err
	}
	if id == "" {
		return usageError{Msg: "usage: harvest runs retry ID [--json]"}
	}
	c, err := runsClient()
	if err != nil {
		return err
	}
	run, err := c.Retry(ctx, id)
	if err != nil {
		return apiFailure(err)
	}
	return printRun(e, run, *asJSON)
}

func printJSON(e env, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode JSON: %w", err)
	}
	fmt.Fprintln(e.stdout, string(b))
	return nil
}

// splitPositional takes the first argument that is not a flag out of args,
// so that `runs get ID --wait 5s` and `runs get --wait 5s ID` both work.
func splitPositional(args []string) (string, []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			if i+1 < len(args) {
				return args[i+1], append(append([]string{}, args[:i]...), args[i+2:]...)
			}
			return "", args[:i]
		}
		if len(a) > 1 && a[0] == '-' {
			// A flag; its value follows unless given with '=' or it is a
			// boolean flag of ours.
			if !containsEq(a) && !isBoolFlag(a) {
				i++
			}
			continue
		}
		return a, append(append([]string{}, args[:i]...), args[i+1:]...)
	}
	return "", args
}

func containsEq(s string) bool {
	for _, c := range s {
		if c == '=' {
			return true
		}
	}
	return false
}

func isBoolFlag(a string) bool {
	switch a {
	case "-json", "--json", "-h", "--help", "-help":
		return true
	}
	return false
}

// apiFailure adds the status and code to a refusal from the gateway.
func apiFailure(err error) error {
	var ae *api.Error
	if errors.As(err, &ae) {
		return fmt.Errorf("%d %s: %s", ae.Status, ae.Code, ae.Message)
	}
	return err
}

func printRun(e env, run api.Run, asJSON bool) error {
	if asJSON {
		return printJSON(e, run)
	}
	fmt.Fprintf(e.stdout, "run       %s\ntenant    %s\nworkflow  %s\nqueue     %s (shard %d, key %q)\nstatus    %s\nattempts  %d\n",
		run.ID, run.Tenant, run.Name, run.Queue, run.Shard, run.FairnessKey, run.Status, run.Attempts)
	fmt.Fprintf(e.stdout, "created   %s\n", run.CreatedAt.Format(time.RFC3339Nano))
	if run.Waiting != nil {
		// Why a queued run is not running yet, as GET /v1/runs/{id} says.
		fmt.Fprintf(e.stdout, "waiting   %s: %s\n", run.Waiting.Reason, run.Waiting.Summary())
	}
	if run.ClaimedAt != nil {
		fmt.Fprintf(e.stdout, "claimed   %s (waited %s)\n", run.ClaimedAt.Format(time.RFC3339Nano),
			run.ClaimedAt.Sub(run.CreatedAt.Time).Round(time.Millisecond))
	}
	if run.FinishedAt != nil {
		fmt.Fprintf(e.stdout, "finished  %s\n", run.FinishedAt.Format(time.RFC3339Nano))
	}
	if len(run.Output) > 0 {
		fmt.Fprintf(e.stdout, "output    %s\n", run.Output)
	}
	if run.Error != nil {
		fmt.Fprintf(e.stdout, "error     %s\n", *run.Error)
	}
	return nil
}
