package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

Reads a run through the gateway at HARVEST_GATEWAY_URL with the token in
HARVEST_TOKEN. --wait waits until the run is final or the time is up.
Exit status: 0 read (whatever the run's status), 1 error, 2 bad usage.`

func runRuns(ctx context.Context, e env, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(e.stderr, "usage: harvest "+runsUsage)
		if len(args) == 0 {
			return usageError{Msg: "name a subcommand: get"}
		}
		return nil
	}
	if args[0] != "get" {
		return usageError{Msg: fmt.Sprintf("unknown runs command %q (want get)", args[0])}
	}
	fs := newFlags(e, "runs get", runsUsage)
	wait := fs.Duration("wait", 0, "wait up to this long for the run to be final")
	asJSON := fs.Bool("json", false, "print the run resource as JSON")
	id, rest := splitPositional(args[1:])
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
		b, err := json.MarshalIndent(run, "", "  ")
		if err != nil {
			return err
		}
		fmt.Fprintln(e.stdout, string(b))
		return nil
	}
	fmt.Fprintf(e.stdout, "run       %s\ntenant    %s\nworkflow  %s\nqueue     %s (shard %d, key %q)\nstatus    %s\nattempts  %d\n",
		run.ID, run.Tenant, run.Name, run.Queue, run.Shard, run.FairnessKey, run.Status, run.Attempts)
	fmt.Fprintf(e.stdout, "created   %s\n", run.CreatedAt.Format(time.RFC3339Nano))
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
