package gateway

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strconv"

	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/weights"
)

// AuditEntry is one row of GET /v1/audit: a shard's audit row with the
// shard it lives on. Weight and quota changes are audited on every shard
// they touch; admission changes on shard 0 only.
type AuditEntry struct {
	Shard int `json:"shard"`
	api.AuditEntry
}

// AuditPage is the body of GET /v1/audit.
type AuditPage struct {
	// Entries are newest first, merged across shards by time.
	Entries []AuditEntry `json:"entries"`
	// NextCursor fetches the next (older) page; empty when every shard
	// has been read to its end.
	NextCursor string `json:"next_cursor"`
	// UnavailableShards did not answer: their rows are missing from this
	// page and show up on a later page once they answer (the cursor keeps
	// their place).
	UnavailableShards []int `json:"unavailable_shards"`
}

// Positions in an audit cursor, one per shard: the id of the last row
// handed out (the next page continues below it), or one of these.
const (
	auditFromTop = 0  // nothing handed out yet
	auditDone    = -1 // the shard has no older rows
)

// auditCursorPrefix versions the cursor format.
const auditCursorPrefix = "a1."

func encodeAuditCursor(pos []int64) string {
	b, _ := json.Marshal(pos)
	return auditCursorPrefix + base64.RawURLEncoding.EncodeToString(b)
}

func decodeAuditCursor(s string, shards int) ([]int64, *api.Error) {
	bad := api.Invalid("cursor", "cursor is not one this API returned")
	if len(s) <= len(auditCursorPrefix) || s[:len(auditCursorPrefix)] != auditCursorPrefix {
		return nil, bad
	}
	raw, err := base64.RawURLEncoding.DecodeString(s[len(auditCursorPrefix):])
	if err != nil {
		return nil, bad
	}
	var pos []int64
	if json.Unmarshal(raw, &pos) != nil || len(pos) != shards {
		return nil, bad
	}
	for _, p := range pos {
		if p < auditDone {
			return nil, bad
		}
	}
	return pos, nil
}

// auditPage merges the audit rows of every shard (or of one, when only >=
// 0), newest first: each shard is read from its place in the cursor, the
// shard lists are merged by time (a k-way merge, so each shard contributes
// a prefix of its own newest-first list and nothing is skipped or repeated),
// and the cursor records, per shard, the last row handed out.
func (g *Gateway) auditPage(ctx context.Context, cursor string, limit, only int) (AuditPage, *api.Error) {
	if limit <= 0 {
		limit = weights.DefaultAuditLimit
	}
	n := len(g.shards)
	pos := make([]int64, n)
	if cursor != "" {
		var e *api.Error
		if pos, e = decodeAuditCursor(cursor, n); e != nil {
			return AuditPage{}, e
		}
	}
	if only >= 0 {
		for i := range pos {
			if i != only {
				pos[i] = auditDone
			}
		}
	}
	pages := make([]api.AuditPage, n)
	errs := make([]error, n)
	var ask []int
	for i := range n {
		if pos[i] != auditDone {
			ask = append(ask, i)
		}
	}
	answers := shards.Each(ctx, ask, func(_, i int) int { return i }, 0,
		func(ctx context.Context, i, _ int) (api.AuditPage, error) {
			c := ""
			if pos[i] != auditFromTop {
				c = strconv.FormatInt(pos[i], 10)
			}
			return weights.AuditList(ctx, g.shards[i], c, limit)
		})
	for _, a := range answers {
		pages[a.Shard], errs[a.Shard] = a.Value, a.Err
		if a.Err != nil {
			g.log.Warn("gateway: audit read", "shard", a.Shard, "err", a.Err)
		}
	}
	out := AuditPage{Entries: []AuditEntry{}, UnavailableShards: shards.Unavailable(answers)}
	if len(ask) > 0 && len(out.UnavailableShards) == len(ask) {
		return AuditPage{}, api.NewError(api.CodeUnavailable, "no shard answered; try again later")
	}
	head := make([]int, n)
	for len(out.Entries) < limit {
		best := -1
		for i := range n {
			if pos[i] == auditDone || errs[i] != nil || head[i] >= len(pages[i].Entries) {
				continue
			}
			if best < 0 || newer(pages[i].Entries[head[i]], pages[best].Entries[head[best]]) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		e := pages[best].Entries[head[best]]
		out.Entries = append(out.Entries, AuditEntry{Shard: best, AuditEntry: e})
		head[best]++
		pos[best] = e.ID
	}
	more := false
	for i := range n {
		if pos[i] == auditDone || errs[i] != nil {
			more = more || (pos[i] != auditDone)
			continue
		}
		if head[i] == len(pages[i].Entries) && pages[i].NextCursor == "" {
			pos[i] = auditDone // read to its end
			continue
		}
		more = true
	}
	if more {
		out.NextCursor = encodeAuditCursor(pos)
	}
	return out, nil
}

// newer orders rows across shards: later time first; ties by shard are
// broken by the caller's scan order (lower shard first).
func newer(a, b api.AuditEntry) bool { return a.At.After(b.At.Time) }
