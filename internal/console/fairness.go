package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/weights"
)

// fairnessView is the fairness part of a queue's page: the modes and the
// group weights on each shard, and the forms that change them.
type fairnessView struct {
	Shards []fairnessRow
	// Mixed is set when the shards that answered disagree (a change that
	// reached only some of them): the forms send it to every shard again.
	Mixed bool
	// TwoLevel and Charge preselect the form: the first shard's modes.
	TwoLevel bool
	Charge   string
	Note     string
	CanWrite bool
}

type fairnessRow struct {
	Shard        int
	Outcome      string
	TwoLevel     bool
	Charge       string
	ChangedBy    string
	GroupWeights string
}

// fairness reads the modes of queue for its page.
func (c *Console) fairness(ctx context.Context, p auth.Principal, queue string) *fairnessView {
	v := &fairnessView{Charge: api.ChargeClaims, CanWrite: p.Has(auth.WeightsWrite)}
	res, err := weights.Fairness(ctx, c.weightShards(), queue, readOpts(p)...)
	if err != nil {
		v.Note = "Fairness modes unavailable: " + err.Error()
		return v
	}
	first := true
	for _, s := range res.Shards {
		row := fairnessRow{Shard: s.Shard, Outcome: string(s.Outcome)}
		if s.Outcome == api.ShardOutcomeOK {
			f := s.Fairness
			row.TwoLevel, row.Charge = f.TwoLevel, f.Charge
			if f.UpdatedAt != nil {
				row.ChangedBy = f.UpdatedBy + " at " + utc(f.UpdatedAt.Time) + " UTC"
			}
			parts := make([]string, len(f.GroupWeights))
			for i, gw := range f.GroupWeights {
				parts[i] = gw.Group + " = " + fmtG(gw.Weight)
			}
			row.GroupWeights = strings.Join(parts, ", ")
			if first {
				v.TwoLevel, v.Charge, first = f.TwoLevel, f.Charge, false
			} else if f.TwoLevel != v.TwoLevel || f.Charge != v.Charge {
				v.Mixed = true
			}
		}
		v.Shards = append(v.Shards, row)
	}
	if len(res.UnavailableShards) > 0 {
		v.Note = fmt.Sprintf("Shards %v did not answer.", res.UnavailableShards)
	}
	return v
}

func (c *Console) pageQueueFairness(w http.ResponseWriter, r *http.Request) {
	c.fairnessAction(w, r, false)
}

func (c *Console) pageQueueGroupWeight(w http.ResponseWriter, r *http.Request) {
	c.fairnessAction(w, r, true)
}

// fairnessAction changes a queue's modes, or with group a group's weight
// (set, or cleared with op=clear), on every shard from the queue's page.
// The form is read only once the session is checked, and used only once
// its CSRF token is (sessionPOST). The change writes its own audit row on
// each shard; a refusal is audited here.
func (c *Console) fairnessAction(w http.ResponseWriter, r *http.Request, group bool) {
	sess, p, rl, ok := c.sessionPOST(w, r)
	if !ok {
		return
	}
	queue := r.PathValue("queue")
	form := r.PostForm
	action := weights.ActionQueueFairness
	if group {
		action = weights.ActionGroupWeightSet
		if form.Get("op") == "clear" {
			action = weights.ActionGroupWeightClear
		}
	}
	attempted := map[string]string{}
	for _, f := range []string{"two_level", "charge", "group", "weight"} {
		if v := form.Get(f); v != "" {
			attempted[f] = v
		}
	}
	switch {
	case rl != roleOperator:
		c.refuseAction(w, r, sess, p, rl, action, "", nil, fmt.Sprintf("Token %q may not change how a queue is shared: that is for operators", p.Name))
		return
	case !p.Has(auth.WeightsWrite):
		c.refuseAction(w, r, sess, p, rl, action, queue, attempted, fmt.Sprintf("Token %q lacks the %s privilege", p.Name, auth.WeightsWrite))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), pageTimeout)
	defer cancel()
	d := base("Queue "+queue, sess, p, rl)

	var err error
	var status int
	var unavailable []int
	done := "fairness"
	if action == weights.ActionQueueFairness {
		var res api.QueueFairnessResult
		res, err = c.setFairnessForm(ctx, p.Name, queue, form.Get("two_level"), form.Get("charge"))
		status, unavailable = res.Status(), res.UnavailableShards
	} else {
		var weight *float64
		if action == weights.ActionGroupWeightSet {
			done = "group-weight"
			f, perr := strconv.ParseFloat(strings.TrimSpace(form.Get("weight")), 64)
			if perr != nil {
				err = api.Invalid("weight", "weight must be a positive finite number, not %q", form.Get("weight"))
			}
			weight = &f
		} else {
			done = "group-weight-cleared"
		}
		if err == nil {
			var res api.GroupWeightResult
			res, err = c.be.SetGroupWeight(ctx, p.Name, queue, strings.TrimSpace(form.Get("group")), weight)
			status, unavailable = res.Status(), res.UnavailableShards
		}
	}
	if err != nil {
		msg := err.Error()
		var ae *api.Error
		if errors.As(err, &ae) {
			msg = ae.Message
		}
		d.Error = "Not changed: " + msg
		c.queuePage(w, r, http.StatusBadRequest, d, p, queue, nil)
		return
	}
	if status != http.StatusOK {
		d.Error = fmt.Sprintf("Shards %v did not take the change; send it again.", unavailable)
		c.queuePage(w, r, status, d, p, queue, nil)
		return
	}
	http.Redirect(w, r, queuePath(queue)+"?done="+done, http.StatusSeeOther)
}

// setFairnessForm sends the fairness form: two_level "on" or "off", and a
// charge.
func (c *Console) setFairnessForm(ctx context.Context, actor, queue, twoLevel, charge string) (api.QueueFairnessResult, error) {
	var req api.QueueFairnessRequest
	switch twoLevel {
	case "on", "off":
		on := twoLevel == "on"
		req.TwoLevel = &on
	case "":
	default:
		return api.QueueFairnessResult{}, api.Invalid("two_level", "two_level must be on or off, not %q", twoLevel)
	}
	if charge != "" {
		req.Charge = &charge
	}
	return c.be.SetFairness(ctx, actor, queue, req)
}
