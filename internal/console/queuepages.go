package console

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strings"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/weights"
)

// The queues pages, for operators with weights:read: the queues of every
// shard with their depths (Queues), and one queue with its depths, pause,
// keys, fairness modes (fairness.go) and the share of claims of each key
// (chart.go). Pause and resume go through the gateway (Backend), as POST
// /v1/queues/{queue}/pause and /resume do, with weights:write.

type queuesView struct {
	Rows        []queueListRow
	Truncated   bool
	Unavailable []int
}

type queueListRow struct {
	QueueDepth
	URL    string
	Paused string
}

type queueView struct {
	Queue       string
	Action      string
	Depths      []queueListRow
	Unavailable []int
	Paused      string // who and since when, and where; empty when running everywhere
	CanPause    bool
	CanResume   bool
	Keys        []keyRow
	KeysNote    string
	Chart       template.HTML
	ChartNote   string
	Fairness    *fairnessView
}

type keyRow struct {
	Key, Label      string
	Shard           int
	Weight          string
	Overridden      bool
	Pass, Lag       string
	Pending, Claims int
}

// queuePath is the page of one queue: queue names may hold slashes,
// spaces and any other character.
func queuePath(queue string) string {
	return "/admin/queues/" + url.PathEscape(queue)
}

// queueAccess lets operators holding weights:read at the queues pages.
func (c *Console) queueAccess(w http.ResponseWriter, sess *session, p auth.Principal, rl role) bool {
	if rl != roleOperator {
		c.forbidden(w, sess, p, rl, fmt.Sprintf("Token %q may not see the queues: they are for operators.", p.Name))
		return false
	}
	if !p.Has(auth.WeightsRead) {
		c.forbidden(w, sess, p, rl, fmt.Sprintf("Token %q lacks the %s privilege.", p.Name, auth.WeightsRead))
		return false
	}
	return true
}

func pauseText(ps *Pause) string {
	if ps == nil {
		return ""
	}
	return "paused by " + ps.By + " since " + utc(ps.At) + " UTC"
}

func (c *Console) pageQueues(w http.ResponseWriter, r *http.Request) {
	sess, p, rl, ok := c.sessionGET(w, r)
	if !ok || !c.queueAccess(w, sess, p, rl) {
		return
	}
	d := base("Queues", sess, p, rl)
	v := &queuesView{}
	d.Live, d.QueueList = true, v
	status := http.StatusOK
	ctx, cancel := context.WithTimeout(r.Context(), pageTimeout)
	defer cancel()
	list, err := Queues(ctx, c.shards, 0)
	if err != nil {
		d.Error, status = c.readError(err, "list the queues")
	}
	v.Truncated, v.Unavailable = list.Truncated, list.UnavailableShards
	for _, q := range list.Queues {
		v.Rows = append(v.Rows, queueListRow{QueueDepth: q, URL: queuePath(q.Queue), Paused: pauseText(q.Paused)})
	}
	c.render(w, status, "queues", d)
}

func (c *Console) pageQueue(w http.ResponseWriter, r *http.Request) {
	sess, p, rl, ok := c.sessionGET(w, r)
	if !ok || !c.queueAccess(w, sess, p, rl) {
		return
	}
	d := base("Queue "+r.PathValue("queue"), sess, p, rl)
	switch r.URL.Query().Get("done") {
	case "paused":
		d.Done = "Paused: workers claim none of its tasks until it is resumed."
	case "resumed":
		d.Done = "Resumed."
	case "fairness":
		d.Done = "Fairness modes changed on every shard: claims follow them from the next one."
	case "group-weight":
		d.Done = "Group weight set on every shard: it applies from the group's next charge."
	case "group-weight-cleared":
		d.Done = "Group weight cleared on every shard: the group weighs 1 again."
	}
	c.queuePage(w, r, http.StatusOK, d, p, r.PathValue("queue"), nil)
}

// queuePage renders the page of queue. res, when set, is the pause or
// resume just made, whose unavailable shards the page lists.
func (c *Console) queuePage(w http.ResponseWriter, r *http.Request, status int, d pageData, p auth.Principal, queue string, res *api.QueuePauseResult) {
	v := &queueView{Queue: queue, Action: queuePath(queue)}
	d.Live, d.Queue = true, v
	if err := weights.ValidateQueue(queue); err != nil {
		msg := err.Error()
		var ae *api.Error
		if errors.As(err, &ae) {
			msg = ae.Message
		}
		d.Error = strings.TrimSpace(d.Error + " " + msg)
		c.render(w, http.StatusBadRequest, "queue", d)
		return
	}
	if res != nil && len(res.UnavailableShards) > 0 {
		d.Error = strings.TrimSpace(fmt.Sprintf("%s Shards %v did not take the change; send it again.", d.Error, res.UnavailableShards))
	}
	ctx, cancel := context.WithTimeout(r.Context(), pageTimeout)
	defer cancel()

	depths, err := QueueDepths(ctx, c.shards, queue)
	if err != nil {
		msg, st := c.readError(err, "read the queue's depths")
		d.Error = strings.TrimSpace(d.Error + " " + msg)
		if status == http.StatusOK {
			status = st
		}
	}
	v.Unavailable = depths.UnavailableShards
	var pausedOn []int
	var first *Pause
	for _, q := range depths.Queues {
		v.Depths = append(v.Depths, queueListRow{QueueDepth: q, Paused: pauseText(q.Paused)})
		if q.Paused != nil {
			pausedOn = append(pausedOn, q.Shard)
			if first == nil || q.Paused.At.Before(first.At) {
				first = q.Paused
			}
		}
	}
	if first != nil {
		v.Paused = fmt.Sprintf("Paused by %s since %s UTC on shards %v.", first.By, utc(first.At), pausedOn)
	}
	v.CanResume = len(pausedOn) > 0
	v.CanPause = err != nil || len(pausedOn) < len(depths.Queues) || len(depths.Queues) == 0

	keys, kerr := weights.Keys(ctx, c.weightShards(), queue, pageKeys, readOpts(p)...)
	if kerr != nil {
		v.KeysNote = "Keys unavailable: " + kerr.Error()
	} else {
		sort.Slice(keys.Shards, func(i, j int) bool { return keys.Shards[i].Shard < keys.Shards[j].Shard })
		for _, s := range keys.Shards {
			if s.Truncated {
				v.KeysNote = strings.TrimSpace(fmt.Sprintf("%s Shard %d has more keys than the %d listed.", v.KeysNote, s.Shard, pageKeys))
			}
			for _, k := range s.Keys {
				row := keyRow{Key: k.Key, Label: k.Key, Shard: s.Shard, Weight: fmtG(k.Weight), Overridden: k.Overridden,
					Lag: fmtG(k.Lag), Pending: k.Pending, Claims: k.ClaimsLastMinute}
				if k.Key == "" {
					row.Label = "(default key)"
				}
				if k.Pass != nil {
					row.Pass = fmtG(*k.Pass)
				}
				v.Keys = append(v.Keys, row)
			}
		}
		if len(keys.UnavailableShards) > 0 {
			v.KeysNote = strings.TrimSpace(fmt.Sprintf("%s Shards %v did not answer.", v.KeysNote, keys.UnavailableShards))
		}
	}

	v.Fairness = c.fairness(ctx, p, queue)

	shares, serr := ClaimShares(ctx, c.shards, queue, shareBucket, shareBuckets, shareMaxKeys, "")
	if serr != nil {
		v.ChartNote = "Claim shares unavailable: " + serr.Error()
	} else {
		v.Chart = shareChart(shares)
		if len(shares.UnavailableShards) > 0 {
			v.ChartNote = fmt.Sprintf("Shards %v did not answer; their claims are missing.", shares.UnavailableShards)
		}
	}
	c.render(w, status, "queue", d)
}

func (c *Console) pageQueuePause(w http.ResponseWriter, r *http.Request)  { c.queueAction(w, r, true) }
func (c *Console) pageQueueResume(w http.ResponseWriter, r *http.Request) { c.queueAction(w, r, false) }

// queueAction pauses or resumes a queue on every shard from its page.
func (c *Console) queueAction(w http.ResponseWriter, r *http.Request, pause bool) {
	sess, p, rl, ok := c.sessionPOST(w, r)
	if !ok {
		return
	}
	queue := r.PathValue("queue")
	action, done := "queue.resume", "resumed"
	if pause {
		action, done = "queue.pause", "paused"
	}
	switch {
	case rl != roleOperator:
		c.refuseAction(w, r, sess, p, rl, action, "", nil, fmt.Sprintf("Token %q may not pause or resume queues: they are for operators", p.Name))
		return
	case !p.Has(auth.WeightsWrite):
		c.refuseAction(w, r, sess, p, rl, action, queue, map[string]bool{"paused": pause},
			fmt.Sprintf("Token %q lacks the %s privilege", p.Name, auth.WeightsWrite))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), pageTimeout)
	defer cancel()
	res, e := c.be.PauseQueue(ctx, p.Name, queue, pause)
	d := base("Queue "+queue, sess, p, rl)
	if e != nil {
		d.Error = "Not " + done + ": " + e.Message
		c.queuePage(w, r, e.Status, d, p, queue, nil)
		return
	}
	if st := res.Status(); st != http.StatusOK {
		// Some shards did not take it: show which, on the page itself.
		d.Done = fmt.Sprintf("%s on some shards only.", strings.ToUpper(done[:1])+done[1:])
		c.queuePage(w, r, st, d, p, queue, &res)
		return
	}
	http.Redirect(w, r, queuePath(queue)+"?done="+done, http.StatusSeeOther)
}

// readOpts are the options of a weights read for p: a tenant's token sees
// only the keys bound to its tenant, an operator's every key.
func readOpts(p auth.Principal) []weights.Option {
	if p.Tenant != "" {
		return []weights.Option{weights.WithOwner(p.Tenant)}
	}
	return nil
}
