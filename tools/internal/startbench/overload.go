package startbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sync"
	"time"
)

// OverloadConfig describes harvest-bench sustain --overload: single
// starts offered at several times what the fleet holds, with a gateway
// killed and restarted on the way.
type OverloadConfig struct {
	Fleet FleetConfig
	// Transports to measure, in order, each on a fleet of its own.
	Transports []string
	// Capacity is the starts per second the fleet holds (the sustained
	// benchmark's highest rate that held, or a mix's breaking point).
	Capacity int
	// Factor times Capacity is offered (3).
	Factor float64
	// Duration is how long the overload lasts (30s).
	Duration time.Duration
	// KillAt is when gateway 0 is killed (SIGKILL) and started again,
	// from the overload's start; zero: a third of Duration; negative:
	// never.
	KillAt time.Duration
	// MaxOutstanding bounds the starts waiting for their answer; a start
	// due while it is reached is not sent (counted as skipped).
	MaxOutstanding int
	// Drain bounds the wait, after the overload, for every acknowledged
	// start to be claimed (3m).
	Drain time.Duration
	// Out receives one JSON line per transport; Log progress (may be nil).
	Out io.Writer
	Log io.Writer
}

// OverloadResult is one transport's overload; times in ms unless named.
type OverloadResult struct {
	Bench       string  `json:"bench"`
	Transport   string  `json:"transport"`
	Gateways    int     `json:"gateways"`
	Capacity    int     `json:"capacity"`
	OfferedPerS float64 `json:"offered_per_s"`
	Seconds     float64 `json:"seconds"`
	Offered     int     `json:"offered"`
	Skipped     int     `json:"skipped"`
	Acked       int     `json:"acked"`
	GoodputPerS float64 `json:"goodput_per_s"`
	GoodputPct  float64 `json:"goodput_pct_of_capacity"`
	Refused429  int     `json:"refused_429"`
	Refused503  int     `json:"refused_503"`
	RefusedP50  float64 `json:"refused_p50_ms"`
	RefusedP99  float64 `json:"refused_p99_ms"`
	// RefusedP99Steady leaves out the refusals sent between the kill of
	// gateway 0 and a second after it was ready again.
	RefusedP99Steady float64 `json:"refused_p99_steady_ms"`
	Errors           int     `json:"errors"`
	AckP50           float64 `json:"ack_p50_ms"`
	AckP99           float64 `json:"ack_p99_ms"`
	// ReadyAfterS is how long the killed gateway took, from its new
	// process's start, to answer /readyz 200 under the load.
	ReadyAfterS float64 `json:"ready_after_restart_s"`
	// DrainedS is how long after the overload every acknowledged start
	// was claimed; Unclaimed what was still not claimed after Drain.
	DrainedS  float64 `json:"drained_s"`
	Unclaimed int     `json:"unclaimed_after_drain"`
	// Lost counts acknowledged starts whose run is not in any shard.
	Lost       int     `json:"lost"`
	Load1      float64 `json:"load1"`
	FirstError string  `json:"first_error,omitempty"`
}

// RunOverload runs the overload over each transport and writes a JSON
// line for each.
func RunOverload(ctx context.Context, cfg OverloadConfig) ([]OverloadResult, error) {
	if cfg.Capacity <= 0 {
		return nil, errors.New("startbench: overload needs the fleet's capacity (starts per second)")
	}
	if cfg.Factor <= 0 {
		cfg.Factor = 3
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 30 * time.Second
	}
	if cfg.KillAt == 0 {
		cfg.KillAt = cfg.Duration / 3
	}
	if cfg.MaxOutstanding <= 0 {
		cfg.MaxOutstanding = 4096
	}
	if cfg.Drain <= 0 {
		cfg.Drain = 3 * time.Minute
	}
	if cfg.Fleet.Gateways <= 0 {
		cfg.Fleet.Gateways = 2
	}
	if len(cfg.Transports) == 0 {
		cfg.Transports = []string{"http", "nats"}
	}
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, format+"\n", args...)
		}
	}
	var out []OverloadResult
	for _, tr := range cfg.Transports {
		r, err := overloadTransport(ctx, cfg, tr, logf)
		if err != nil {
			return out, err
		}
		out = append(out, r)
		line, _ := json.Marshal(r)
		fmt.Fprintln(cfg.Out, string(line))
		logf("overload: %s: offered %.0f/s, goodput %.0f/s (%.0f%% of %d), refused p99 %.1f ms, ready after restart %.2f s, lost %d, unclaimed %d (load %.2f)",
			tr, r.OfferedPerS, r.GoodputPerS, r.GoodputPct, r.Capacity, r.RefusedP99, r.ReadyAfterS, r.Lost, r.Unclaimed, r.Load1)
	}
	return out, nil
}

func overloadTransport(ctx context.Context, cfg OverloadConfig, tr string, logf func(string, ...any)) (r OverloadResult, err error) {
	logf("overload: %s: starting a fleet (%d gateways)", tr, cfg.Fleet.Gateways)
	f, err := startFleet(ctx, cfg.Fleet, logf)
	if err != nil {
		return r, err
	}
	defer func() { err = errors.Join(err, f.close()) }()
	send, err := f.sender(tr, 8, cfg.MaxOutstanding)
	if err != nil {
		return r, err
	}
	rate := cfg.Factor * float64(cfg.Capacity)
	r = OverloadResult{Bench: "overload", Transport: tr, Gateways: cfg.Fleet.Gateways, Capacity: cfg.Capacity,
		OfferedPerS: round(rate), Offered: int(math.Round(rate * cfg.Duration.Seconds()))}
	prefix := fmt.Sprintf("%s-o%s-", randomTag(), tr)

	var (
		mu       sync.Mutex
		ackLat   []time.Duration
		refLat   []time.Duration
		refAt    []time.Time
		killedAt time.Time
		readyAt  time.Time
		ackedIDs []string
		firstErr string
		wg       sync.WaitGroup
	)
	slots := make(chan struct{}, cfg.MaxOutstanding)
	readyCh := make(chan time.Duration, 1)
	killErr := make(chan error, 1)
	start := time.Now()
	if cfg.KillAt > 0 && cfg.KillAt < cfg.Duration {
		wg.Go(func() {
			select {
			case <-time.After(cfg.KillAt):
			case <-ctx.Done():
				return
			}
			logf("overload: %s: killing gateway 0 and starting it again", tr)
			mu.Lock()
			killedAt = time.Now()
			mu.Unlock()
			f.killGateway(0)
			took, err := f.startGateway(ctx, 0)
			mu.Lock()
			readyAt = time.Now()
			mu.Unlock()
			logf("overload: %s: gateway 0 ready %.2fs after its start; its log:\n%s", tr, took.Seconds(), f.gws[0].Log())
			readyCh <- took
			killErr <- err
		})
	}
	tick := time.NewTicker(time.Millisecond)
	sent := 0
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case now := <-tick.C:
			due := min(r.Offered, int(now.Sub(start).Seconds()*rate))
			for ; sent < due; sent++ {
				select {
				case slots <- struct{}{}:
				default:
					r.Skipped++
					continue
				}
				n := sent
				wg.Go(func() {
					defer func() { <-slots }()
					id := fmt.Sprintf("%s%d", prefix, n)
					at := time.Now()
					o := send(ctx, n, n%len(f.tenants), id)
					mu.Lock()
					defer mu.Unlock()
					switch {
					case o.acked:
						r.Acked++
						ackLat = append(ackLat, o.took)
						ackedIDs = append(ackedIDs, id)
					case o.refused && o.status == http.StatusTooManyRequests:
						r.Refused429++
						refLat, refAt = append(refLat, o.took), append(refAt, at)
					case o.refused:
						r.Refused503++
						refLat, refAt = append(refLat, o.took), append(refAt, at)
					default:
						r.Errors++
						if firstErr == "" {
							firstErr = o.err.Error()
						}
					}
				})
			}
			if sent >= r.Offered {
				break loop
			}
		}
	}
	tick.Stop()
	offerEnd := time.Now()
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return r, err
	}
	select {
	case took := <-readyCh:
		r.ReadyAfterS = round(took.Seconds())
		if err := <-killErr; err != nil {
			return r, err
		}
	default:
	}
	// Goodput over the offered window: what was acknowledged per second.
	window := offerEnd.Sub(start).Seconds()
	r.Seconds = round(window)
	r.GoodputPerS = round(float64(r.Acked) / window)
	r.GoodputPct = round(100 * r.GoodputPerS / float64(cfg.Capacity))
	r.FirstError = firstErr
	var steady []time.Duration
	for i, at := range refAt {
		if killedAt.IsZero() || at.Before(killedAt) || (!readyAt.IsZero() && at.After(readyAt.Add(time.Second))) {
			steady = append(steady, refLat[i])
		}
	}
	slices.Sort(steady)
	r.RefusedP99Steady = pct(steady, 99)
	slices.Sort(ackLat)
	slices.Sort(refLat)
	r.AckP50, r.AckP99 = pct(ackLat, 50), pct(ackLat, 99)
	r.RefusedP50, r.RefusedP99 = pct(refLat, 50), pct(refLat, 99)

	// The backlog drains, and nothing acknowledged is lost.
	drainStart := time.Now()
	for {
		left, err := f.unclaimed(ctx, prefix)
		if err != nil {
			return r, err
		}
		r.Unclaimed = left
		if left == 0 || time.Since(drainStart) > cfg.Drain {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	r.DrainedS = round(time.Since(drainStart).Seconds())
	have, err := f.ids(ctx, prefix)
	if err != nil {
		return r, err
	}
	for _, id := range ackedIDs {
		if !have[id] {
			r.Lost++
		}
	}
	r.Load1 = loadAvg()
	return r, nil
}
