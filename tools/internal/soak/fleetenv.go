package soak

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/harvest-run/harvest/internal/envdoc"
	"github.com/harvest-run/harvest/internal/gateway"
	"github.com/harvest-run/harvest/internal/workerbin"
)

// Setting is one environment variable the fleet gives its gateways or
// workers, with the reason it does.
type Setting struct {
	Var, Value, Why string
}

// workerRequired are the variables every worker of the fleet needs,
// whatever it is tuned for: where it works, under what id, and what it
// runs. Everything else keeps the shipped default unless the fleet tunes
// it for faults (workerTuning).
func (f *Fleet) workerRequired(s int, id string) []Setting {
	return []Setting{
		{"HARVEST_WORKER_SHARD", strconv.Itoa(s), "the shard it serves"},
		{"HARVEST_WORKER_QUEUES", Queue + ":1", "the load's one queue"},
		{"HARVEST_WORKER_ID", id, "the harness tells its workers apart by name"},
		{"HARVEST_WORKER_FAIRNESS_KEYS", "true", "the load's keys, weights and priority band are the fair claim's"},
		{"HARVEST_WORKER_METRICS_ADDR", "", "several workers share one host: no metrics listener"},
		// The mix's sleep, fail and steps runs (mix.go, load.go) are the
		// demo workflows, which the stock worker runs only when asked.
		{"HARVEST_WORKER_DEMO_HANDLERS", "true", "the load's sleep, fail and steps runs are the demo workflows"},
	}
}

// workerTuning are the worker settings the fleet changes from the shipped
// defaults for its faults (none with Options.Shipped).
func (o Options) workerTuning() []Setting {
	if o.Shipped {
		return nil
	}
	lease := o.Lease
	return []Setting{
		{"HARVEST_WORKER_MAX_CONCURRENT_CLAIMS", strconv.Itoa(o.Slots),
			"the fault tests keep few tasks in flight so that a fault hits a known one; the soak sets enough that the fleet, not its slots, sets the pace"},
		{"HARVEST_WORKER_LEASE", lease.String(),
			"a killed or paused worker's tasks are claimed again within about a lease: the default would hold them past the claim-wait bound"},
		{"HARVEST_WORKER_HEARTBEAT_INTERVAL", (lease / 4).String(), "a quarter of the short lease"},
		{"HARVEST_WORKER_POLL_INTERVAL", "100ms", "while a fault has NATS down there are no wake-ups: idle claim loops look for work ten times as often"},
		{"HARVEST_WORKER_JANITOR_INTERVAL", o.JanitorInterval.String(),
			"lease rescue and promotion follow a fault within a tick (the soak's is a second: a faster janitor slows the claims of a growing shard)"},
		// A continuation waits for the worker that made it this long; when
		// that worker was killed by a fault, that is the continuation's
		// wait, so keep it to twice the lease.
		{"HARVEST_WORKER_STICKY_FOR", (2 * lease).String(),
			"a continuation waits this long for the worker that made it, also when a fault killed that worker"},
		{"HARVEST_WORKER_RETRY_BASE", "10ms", "attempts failed by faults retry at once, so that runs end within the test"},
		{"HARVEST_WORKER_RETRY_MAX", "50ms", "the same, for later attempts"},
		{"HARVEST_WORKER_SHUTDOWN_GRACE", "2s", "a worker stopped by a fault or at the end hands its tasks back quickly"},
		{"HARVEST_WORKER_HANDLE_TIMEOUT", "5s", "a bridged attempt whose reply a NATS fault lost fails after 5s rather than 5m"},
	}
}

// gatewayRequired are the variables every gateway of the fleet needs.
func (f *Fleet) gatewayRequired(i int) []Setting {
	return []Setting{
		{"HARVEST_GATEWAY_ADDR", f.gwAddrs[i], "a free port of its own"},
		{"HARVEST_GATEWAY_TOKENS_FILE", f.tokensFile, "the harness's tenants and admin token"},
		// The load names its keys and quota keys as the checks read them
		// back (trickle, the weighted keys); binding would prefix them
		// with each tenant. Off on purpose here, and logged by the gateway.
		{"HARVEST_GATEWAY_KEY_BINDING", "false",
			"the load's keys are shared by its tenants (the weighted pair, the metered quota) and read back by name; binding would prefix each with its tenant"},
		{"HARVEST_MAX_RUNS", strconv.Itoa(f.opts.MaxRuns), "the system limit the run asks for (the default, 128, is for a demo)"},
	}
}

// gatewayTuning are the gateway settings the fleet changes from the
// shipped defaults for its faults (none with Options.Shipped).
func (o Options) gatewayTuning() []Setting {
	if o.Shipped {
		return nil
	}
	return []Setting{
		{"HARVEST_GATEWAY_CONNECT_TIMEOUT", "1s", "a start to a shard cut off by a fault is answered 503 within a second"},
		{"HARVEST_GATEWAY_MAX_WAIT", "5s", "long polls end within a fault's time"},
		// Few connections: a test server may allow only 100 in all, and
		// other test packages share it.
		{"HARVEST_GATEWAY_POOL_SIZE", strconv.Itoa(o.GatewayPool), "few connections: the fault tests share a test server's 100 with other packages"},
	}
}

// Tuning returns the settings the fleet's workers and gateways run with
// that differ from the shipped defaults for the sake of the faults.
func (f *Fleet) Tuning() (worker, gateway []Setting) {
	return f.opts.workerTuning(), f.opts.gatewayTuning()
}

func envOf(settings ...[]Setting) []string {
	var out []string
	for _, list := range settings {
		for _, s := range list {
			out = append(out, s.Var+"="+s.Value)
		}
	}
	return out
}

// shippedDefaults maps every variable of the gateway and the worker to
// its shipped default, as the binaries read them.
func shippedDefaults() map[string]string {
	vars, err := envdoc.Vars("HARVEST", &workerbin.Config{}, &gateway.Config{})
	out := map[string]string{}
	if err != nil {
		return out
	}
	for _, v := range vars {
		out[v.Name] = v.Default
	}
	return out
}

// writeSettings prints settings with the shipped default of each and why
// the fleet sets it.
func writeSettings(out io.Writer, title string, settings []Setting) {
	if len(settings) == 0 {
		return
	}
	def := shippedDefaults()
	fmt.Fprintln(out, title)
	tw := tabwriter.NewWriter(out, 1, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  variable\tset to\tshipped default\twhy\t")
	for _, s := range settings {
		d, ok := def[s.Var]
		switch {
		case !ok:
			d = "?"
		case d == "":
			d = `""`
		}
		v := s.Value
		if v == "" {
			v = `""`
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t\n", s.Var, v, d, s.Why)
	}
	_ = tw.Flush()
}

// shippedSummary is one line of the shipped worker settings the mix runs
// on, read from the worker's configuration.
func shippedSummary() string {
	def := shippedDefaults()
	var parts []string
	for _, v := range []struct{ name, label string }{
		{"HARVEST_WORKER_LEASE", "lease"}, {"HARVEST_WORKER_HEARTBEAT_INTERVAL", "heartbeat"},
		{"HARVEST_WORKER_STICKY_FOR", "sticky"}, {"HARVEST_WORKER_MAX_CONCURRENT_CLAIMS", "slots"},
		{"HARVEST_WORKER_CLAIM_BATCH", "claim batch"}, {"HARVEST_WORKER_BATCH_CLAIMERS", "claimers"},
		{"HARVEST_WORKER_COMPLETE_BATCH", "complete batch"}, {"HARVEST_WORKER_POLL_INTERVAL", "poll"},
		{"HARVEST_WORKER_JANITOR_INTERVAL", "janitor"}, {"HARVEST_WORKER_RETRY_BASE", "retry base"},
		{"HARVEST_GATEWAY_POOL_SIZE", "gateway pool"}, {"HARVEST_GATEWAY_GROUP_MAX", "start group"},
	} {
		parts = append(parts, v.label+" "+def[v.name])
	}
	return strings.Join(parts, ", ")
}
