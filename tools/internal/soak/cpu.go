package soak

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/harvest-run/harvest/tools/internal/child"
)

// cpuSampler keeps the CPU time each part of the fleet has used: the
// harness (load, NATS server, probe handler, monitor), the gateways and
// the workers by their last reading (a process killed by a fault keeps
// what it had used at the reading before), and the PostgreSQL server.
type cpuSampler struct {
	f       *Fleet
	at      time.Time
	harness time.Duration
	pg      time.Duration
	procs   map[string]time.Duration // name/pid -> CPU
}

func newCPUSampler(f *Fleet) *cpuSampler {
	c := &cpuSampler{f: f, procs: map[string]time.Duration{}}
	c.sample()
	return c
}

func (c *cpuSampler) sample() {
	c.at = time.Now()
	c.harness = child.CPU(os.Getpid())
	c.pg = child.PostgresCPU()
	for _, p := range c.f.Procs() {
		if !p.Exited() {
			if t := child.CPU(p.Pid()); t > 0 {
				// By name and pid: a gateway restarted after a fault has
				// the same name and a fresh count.
				c.procs[fmt.Sprintf("%s/%d", p.Name, p.Pid())] = t
			}
		}
	}
}

// snapshot is a copy of the last sample.
func (c *cpuSampler) snapshot() cpuSampler {
	out := *c
	out.procs = map[string]time.Duration{}
	for k, v := range c.procs {
		out.procs[k] = v
	}
	return out
}

// writeCPU prints what each part used between two samples, in seconds and
// as a share of the machine's cores.
func writeCPU(out io.Writer, from, to cpuSampler) {
	if line := cpuLine(from, to); line != "" {
		fmt.Fprintf(out, "\nCPU over the %s\n", line)
	}
}

// cpuLine is what each part used between two samples: "<time> of load, of
// <n> cores: harness ..., idle ..." ("" for no time).
func cpuLine(from, to cpuSampler) string {
	el := to.at.Sub(from.at)
	if el <= 0 {
		return ""
	}
	var gw, wk time.Duration
	for name, t := range to.procs {
		d := t - from.procs[name]
		if strings.HasPrefix(name, "gateway") {
			gw += d
		} else {
			wk += d
		}
	}
	cores := float64(runtime.NumCPU())
	part := func(d time.Duration) string {
		return fmt.Sprintf("%.0f s (%.0f%%)", d.Seconds(), 100*d.Seconds()/(el.Seconds()*cores))
	}
	hs, pg := to.harness-from.harness, to.pg-from.pg
	return fmt.Sprintf("%s of load, of %d cores: harness %s, gateways %s, workers %s, postgres %s; idle %s",
		el.Round(time.Second), runtime.NumCPU(), part(hs), part(gw), part(wk), part(pg),
		part(max(0, time.Duration(el.Seconds()*cores*float64(time.Second))-hs-gw-wk-pg)))
}
