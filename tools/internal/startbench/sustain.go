package startbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
)

// The rule a step of the sustained benchmark holds by (issue 36): at least
// this share of the offered starts acknowledged, the 95th percentile of
// start-to-claim under holdP95, and every acknowledged start claimed
// holdClaimedAfter after the step.
const (
	holdAcked        = 0.95
	holdP95          = time.Second
	holdClaimedAfter = 10 * time.Second
)

// SustainConfig describes a run of harvest-bench sustain.
type SustainConfig struct {
	Fleet FleetConfig
	// Transports to measure, in order: "http", "nats".
	Transports []string
	// Rates are the steps' offered starts per second, rising.
	Rates []int
	// Step is how long each rate is offered (10s).
	Step time.Duration
	// Senders is the number of concurrent senders (128).
	Senders int
	// KeepGoing measures every rate, rather than stopping at the first
	// that fails.
	KeepGoing bool
	// River, when set, runs River's side the same way after Harvest's
	// (river-bench sustain), with these settings.
	River *RiverConfig
	// Out receives one JSON line per step; Log progress (may be nil).
	Out io.Writer
	Log io.Writer
}

// StepResult is one step of the sustained benchmark; times in ms.
type StepResult struct {
	Bench     string  `json:"bench"`
	System    string  `json:"system"`
	Transport string  `json:"transport,omitempty"`
	Rate      int     `json:"rate"`
	Seconds   float64 `json:"seconds"`
	Offered   int     `json:"offered"`
	Sent      int     `json:"sent"`
	Acked     int     `json:"acked"`
	Refused   int     `json:"refused"`
	Errors    int     `json:"errors"`
	AckedPct  float64 `json:"acked_pct"`
	AckP50    float64 `json:"ack_p50_ms"`
	AckP99    float64 `json:"ack_p99_ms"`
	Claimed   int     `json:"claimed"`
	WaitP50   float64 `json:"wait_p50_ms"`
	WaitP95   float64 `json:"wait_p95_ms"`
	WaitP99   float64 `json:"wait_p99_ms"`
	Unclaimed int     `json:"unclaimed"`
	Holds     bool    `json:"holds"`
	Load1     float64 `json:"load1"`
	// FirstError is the first answer that was neither an
	// acknowledgement nor a refusal.
	FirstError string `json:"first_error,omitempty"`
}

// judge fills in Holds by the rule.
func (r *StepResult) judge() {
	if r.Offered > 0 {
		r.AckedPct = round(100 * float64(r.Acked) / float64(r.Offered))
	}
	r.Holds = r.Offered > 0 && float64(r.Acked) >= holdAcked*float64(r.Offered) &&
		r.WaitP95 < float64(holdP95/time.Millisecond) && r.Unclaimed == 0 && r.Claimed > 0
}

// SustainSummary is the highest rate that held per system and transport.
type SustainSummary struct {
	Bench   string         `json:"bench"`
	Highest map[string]int `json:"highest"`
}

// RunSustain offers single starts of echo at each rate of cfg.Rates in
// turn, on a fleet of its own per transport, and writes a JSON line per
// step and one with the highest rate that held for each.
func RunSustain(ctx context.Context, cfg SustainConfig) (SustainSummary, error) {
	if cfg.Step <= 0 {
		cfg.Step = 10 * time.Second
	}
	if cfg.Senders <= 0 {
		cfg.Senders = 128
	}
	if len(cfg.Transports) == 0 {
		cfg.Transports = []string{"http", "nats"}
	}
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, format+"\n", args...)
		}
	}
	sum := SustainSummary{Bench: "sustain", Highest: map[string]int{}}
	emit := func(r StepResult) {
		line, _ := json.Marshal(r)
		fmt.Fprintln(cfg.Out, string(line))
		name := r.System
		if r.Transport != "" {
			name += "/" + r.Transport
		}
		if _, ok := sum.Highest[name]; !ok {
			sum.Highest[name] = 0
		}
		if r.Holds && r.Rate > sum.Highest[name] {
			sum.Highest[name] = r.Rate
		}
		logf("sustain: %s %d/s: acked %.1f%%, wait p95 %.0f ms, unclaimed %d: %s (load %.2f)",
			name, r.Rate, r.AckedPct, r.WaitP95, r.Unclaimed, map[bool]string{true: "holds", false: "fails"}[r.Holds], r.Load1)
	}
	for _, tr := range cfg.Transports {
		if err := sustainTransport(ctx, cfg, tr, logf, emit); err != nil {
			return sum, err
		}
	}
	if cfg.River != nil {
		rc := *cfg.River
		rc.Rates, rc.Step, rc.Senders, rc.KeepGoing = cfg.Rates, cfg.Step, cfg.Senders, cfg.KeepGoing
		rc.ServerURL = cfg.Fleet.ServerURL
		steps, err := RunRiverSustain(ctx, rc, cfg.Log)
		for _, s := range steps {
			emit(s)
		}
		if err != nil {
			return sum, err
		}
	}
	line, _ := json.Marshal(sum)
	fmt.Fprintln(cfg.Out, string(line))
	return sum, nil
}

// sustainTransport runs the steps of one transport on a fresh fleet.
func sustainTransport(ctx context.Context, cfg SustainConfig, tr string, logf func(string, ...any), emit func(StepResult)) (err error) {
	logf("sustain: %s: starting a fleet (%d shards, %d tenants)", tr, max(cfg.Fleet.Shards, 1), max(cfg.Fleet.Tenants, 1))
	f, err := startFleet(ctx, cfg.Fleet, logf)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, f.close()) }()
	send, err := f.sender(tr, 1, cfg.Senders)
	if err != nil {
		return err
	}
	tag := randomTag()
	for i, rate := range cfg.Rates {
		prefix := fmt.Sprintf("%s-%s-%d-", tag, tr, i)
		r, err := f.step(ctx, send, rate, cfg.Step, cfg.Senders, prefix)
		if err != nil {
			return err
		}
		r.System, r.Transport = "harvest", tr
		emit(r)
		if !r.Holds && !cfg.KeepGoing {
			break
		}
	}
	return nil
}

// sendFunc sends start n of tenant t with id and reports the answer.
type sendFunc func(ctx context.Context, n int, tenant int, id string) outcome

// outcome is one start's answer.
type outcome struct {
	acked   bool
	refused bool // 429 or 503 from a gateway
	status  int  // the refusal's status
	err     error
	took    time.Duration
}

// sender returns how starts are sent over tr to the fleet's gateways:
// over HTTP spread over the gateways (a start whose gateway cannot be
// reached is sent once to the next, as a load balancer would), over NATS
// spread over conns connections.
func (f *fleet) sender(tr string, conns, maxConns int) (sendFunc, error) {
	tenants := len(f.tenants)
	switch tr {
	case "http":
		var clients [][]*client.Client // [gateway][tenant]
		for gw := range f.gwAddrs {
			hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: maxConns, MaxConnsPerHost: maxConns,
				IdleConnTimeout: 30 * time.Second}}
			var row []*client.Client
			for i := range tenants {
				c, err := f.httpClient(i, gw, hc)
				if err != nil {
					return nil, err
				}
				row = append(row, c)
			}
			clients = append(clients, row)
		}
		return func(ctx context.Context, n, t int, id string) outcome {
			gw := n % len(clients)
			o := sendOne(ctx, clients[gw][t], id, n)
			if o.err != nil && !o.refused && len(clients) > 1 && isConnRefused(o.err) {
				o2 := sendOne(ctx, clients[(gw+1)%len(clients)][t], id, n)
				o2.took += o.took
				return o2
			}
			return o
		}, nil
	case "nats":
		clients, err := f.natsClients(conns)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context, n, t int, id string) outcome {
			return sendOne(ctx, clients[n%len(clients)][t], id, n)
		}, nil
	}
	return nil, fmt.Errorf("startbench: unknown transport %q (http, nats)", tr)
}

// sendOne sends one start of echo and classifies its answer.
func sendOne(ctx context.Context, c *client.Client, id string, n int) outcome {
	t0 := time.Now()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := c.StartRequest(rctx, api.StartRequest{ID: id, Name: "echo", Queue: benchQueue,
		Input: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))})
	o := outcome{took: time.Since(t0), acked: err == nil, err: err}
	var ce *client.Error
	if errors.As(err, &ce) && (ce.API.Status == http.StatusTooManyRequests || ce.API.Status == http.StatusServiceUnavailable) {
		o.refused, o.status = true, ce.API.Status
	}
	return o
}

func isConnRefused(err error) bool {
	return strings.Contains(err.Error(), "connection refused") || strings.Contains(err.Error(), "connection reset")
}

// step offers rate starts per second for d from senders concurrent
// senders (start k due at k/rate after the step's start; a sender that
// falls behind sends late, and what is not sent by the end of the step is
// not acknowledged), then reads the start-to-claim waits from the shards.
func (f *fleet) step(ctx context.Context, send sendFunc, rate int, d time.Duration, senders int, prefix string) (StepResult, error) {
	r := StepResult{Bench: "sustain", Rate: rate, Offered: int(math.Round(float64(rate) * d.Seconds()))}
	var (
		next    atomic.Int64
		mu      sync.Mutex
		lat     []time.Duration
		acked   atomic.Int64
		refused atomic.Int64
		errs    atomic.Int64
		sent    atomic.Int64
		first   atomic.Value
		wg      sync.WaitGroup
	)
	start := time.Now()
	end := start.Add(d)
	for range senders {
		wg.Go(func() {
			var mine []time.Duration
			for ctx.Err() == nil {
				k := int(next.Add(1) - 1)
				if k >= r.Offered {
					break
				}
				due := start.Add(time.Duration(float64(k) / float64(rate) * float64(time.Second)))
				if wait := time.Until(due); wait > 0 {
					time.Sleep(wait)
				}
				if time.Now().After(end) {
					break
				}
				sent.Add(1)
				o := send(ctx, k, k%len(f.tenants), fmt.Sprintf("%s%d", prefix, k))
				switch {
				case o.acked:
					acked.Add(1)
					mine = append(mine, o.took)
				case o.refused:
					refused.Add(1)
				default:
					errs.Add(1)
					first.CompareAndSwap(nil, o.err.Error())
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return r, err
	}
	r.Seconds = round(time.Since(start).Seconds())
	r.Sent, r.Acked, r.Refused, r.Errors = int(sent.Load()), int(acked.Load()), int(refused.Load()), int(errs.Load())
	if v := first.Load(); v != nil {
		r.FirstError = v.(string)
	}
	slices.Sort(lat)
	r.AckP50, r.AckP99 = pct(lat, 50), pct(lat, 99)

	// Everything claimed within holdClaimedAfter of the step's end, or
	// what is left then counts as unclaimed.
	deadline := end.Add(holdClaimedAfter)
	for {
		left, err := f.unclaimed(ctx, prefix)
		if err != nil {
			return r, err
		}
		if left == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	waits, unclaimed, err := f.waits(ctx, prefix)
	if err != nil {
		return r, err
	}
	r.Claimed, r.Unclaimed = len(waits), unclaimed
	r.WaitP50, r.WaitP95, r.WaitP99 = pct(waits, 50), pct(waits, 95), pct(waits, 99)
	r.Load1 = loadAvg()
	r.judge()
	return r, nil
}

// unclaimed counts the runs with ids under prefix not claimed yet, over
// every shard.
func (f *fleet) unclaimed(ctx context.Context, prefix string) (int, error) {
	total := 0
	for i, p := range f.pools {
		var n int
		if err := p.QueryRow(ctx, `SELECT count(*) FROM runs_seen WHERE id LIKE $1 AND claimed_at IS NULL`, prefix+"%").Scan(&n); err != nil {
			return 0, fmt.Errorf("startbench: shard %d: %w", i, err)
		}
		total += n
	}
	return total, nil
}

// waits reads the start-to-claim wait of every claimed run with an id
// under prefix (runs.claimed_at - runs.created_at, both the shard's
// clock) and counts the unclaimed ones.
func (f *fleet) waits(ctx context.Context, prefix string) ([]time.Duration, int, error) {
	var out []time.Duration
	unclaimed := 0
	for i, p := range f.pools {
		rows, err := p.Query(ctx, `SELECT extract(epoch FROM claimed_at - created_at)::float8 FROM runs_seen WHERE id LIKE $1`, prefix+"%")
		if err != nil {
			return nil, 0, fmt.Errorf("startbench: shard %d: %w", i, err)
		}
		secs, err := pgx.CollectRows(rows, pgx.RowTo[*float64])
		if err != nil {
			return nil, 0, err
		}
		for _, s := range secs {
			if s == nil {
				unclaimed++
				continue
			}
			out = append(out, time.Duration(*s*float64(time.Second)))
		}
	}
	slices.Sort(out)
	return out, unclaimed, nil
}

// ids returns the ids of the runs under prefix, over every shard.
func (f *fleet) ids(ctx context.Context, prefix string) (map[string]bool, error) {
	out := map[string]bool{}
	for i, p := range f.pools {
		rows, err := p.Query(ctx, `SELECT id FROM runs_seen WHERE id LIKE $1`, prefix+"%")
		if err != nil {
			return nil, fmt.Errorf("startbench: shard %d: %w", i, err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			out[id] = true
		}
	}
	return out, nil
}

// randomTag tells one run's ids from another's.
func randomTag() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
