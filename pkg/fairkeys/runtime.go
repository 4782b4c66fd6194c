package fairkeys

import "fmt"

// Charge is what a fair claim of a queue bills its key.
type Charge string

const (
	// ChargeClaims bills every claim 1/w, whatever the task costs: keys
	// share the claims by their weights. It is the default.
	ChargeClaims Charge = "claims"
	// ChargeRuntime bills a key for the time its tasks hold a worker:
	// keys share the worker time by their weights. A claim bills the
	// key's estimate up front (so a key cannot take every free worker
	// before its first task ends), and when the attempt ends the
	// difference to the time it really held is settled, so in all a key
	// pays exactly what its attempts held, over its weight.
	ChargeRuntime Charge = "runtime"
)

// DefaultHeldEstimate is the seconds a claim bills in a queue charged by
// runtime while none of its key's attempts has ended yet.
const DefaultHeldEstimate = 1.0

// heldEstimateGain is how far one settlement moves a key's estimate toward
// the mean held time of the attempts it settles.
const heldEstimateGain = 0.25

// ValidateCharge checks a charge mode's name.
func ValidateCharge(c Charge) error {
	switch c {
	case ChargeClaims, ChargeRuntime:
		return nil
	}
	return fmt.Errorf("charge must be %q or %q, not %q", ChargeClaims, ChargeRuntime, c)
}

// heldRow is one ended attempt of a queue charged by runtime, waiting for
// the next fair claim to settle it.
type heldRow struct {
	key    string
	secs   float64
	billed float64
}

// SetCharge sets what a fair claim of the queue bills (ChargeClaims when
// never set). Attempts already running keep the way they were billed.
func (m *Model) SetCharge(queue string, c Charge) {
	if err := ValidateCharge(c); err != nil {
		panic("fairkeys: " + err.Error())
	}
	if c == ChargeRuntime {
		m.runtime[queue] = true
		return
	}
	delete(m.runtime, queue)
}

// HeldEstimate returns the seconds the key's next claim would bill in a
// queue charged by runtime, and whether that is a measured estimate
// (false: DefaultHeldEstimate).
func (m *Model) HeldEstimate(queue, key string) (float64, bool) {
	e, ok := m.heldEst[StateKey{queue, key}]
	if !ok {
		return DefaultHeldEstimate, false
	}
	return e, true
}

func (m *Model) estimate(queue, key string) float64 {
	e, _ := m.HeldEstimate(queue, key)
	return e
}

// endAttempt records the held time of a running attempt billed by runtime.
func (m *Model) endAttempt(r *taskRow, heldSecs float64) {
	if !r.runtime {
		return
	}
	m.held[r.t.Queue] = append(m.held[r.t.Queue], heldRow{key: r.t.Key, secs: max(heldSecs, 0), billed: r.billed})
	r.billed, r.runtime = 0, false
}

// foldHeld settles the queue's ended attempts, as every fair claim does
// before it picks: each key's pass moves by (held - billed)/w, summed in
// the order the attempts ended, and its estimate a quarter of the way to
// their mean held time; in a two-level queue the group's pass moves by the
// same seconds over the group's weight. A key or group without a row
// (pruned while its task ran) has nothing to settle.
func (m *Model) foldHeld(queue string) {
	rows := m.held[queue]
	if len(rows) == 0 {
		return
	}
	delete(m.held, queue)
	type sum struct {
		delta, secs float64
		n           int
	}
	keys := map[string]*sum{}
	groups := map[string]*sum{}
	for _, h := range rows {
		k := keys[h.key]
		if k == nil {
			k = &sum{}
			keys[h.key] = k
		}
		k.delta += h.secs - h.billed
		k.secs += h.secs
		k.n++
		g := groups[GroupOf(h.key)]
		if g == nil {
			g = &sum{}
			groups[GroupOf(h.key)] = g
		}
		g.delta += h.secs - h.billed
	}
	states := m.states[queue]
	for key, k := range keys {
		s, ok := states[key]
		if !ok {
			continue
		}
		s.Pass += k.delta / m.Weight(queue, key)
		states[key] = s
		mean := k.secs / float64(k.n)
		sk := StateKey{queue, key}
		if e, ok := m.heldEst[sk]; ok {
			m.heldEst[sk] = e + (mean-e)*heldEstimateGain
		} else {
			m.heldEst[sk] = mean
		}
	}
	if !m.twoLevel[queue] {
		return
	}
	gs := m.groupStates[queue]
	for grp, g := range groups {
		s, ok := gs[grp]
		if !ok {
			continue
		}
		s.Pass += g.delta / m.GroupWeight(queue, grp)
		gs[grp] = s
	}
}
