package gateway

import (
	"bytes"
	"fmt"
	"net/http"
	"reflect"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/weights"
)

// fairnessRoutes adds the routes of a queue's fairness modes to mux:
//
//	GET    /v1/queues/{queue}/fairness                weights:read
//	PUT    /v1/queues/{queue}/fairness                weights:write, an operator's token
//	PUT    /v1/queues/{queue}/group-weights/{group}   weights:write, an operator's token
//	DELETE /v1/queues/{queue}/group-weights/{group}   weights:write, an operator's token
//
// The writes are refused to a tenant's token whatever its privileges: the
// modes and the group weights decide how a queue is shared among every
// tenant.
func (g *Gateway) fairnessRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/queues/{queue}/fairness", g.operator(auth.WeightsRead, g.httpGetFairness))
	mux.HandleFunc("PUT /v1/queues/{queue}/fairness",
		g.audited(weights.ActionQueueFairness, "", g.operator(auth.WeightsWrite, g.httpSetFairness)))
	mux.HandleFunc("PUT /v1/queues/{queue}/group-weights/{group}",
		g.audited(weights.ActionGroupWeightSet, "group", g.operator(auth.WeightsWrite, g.httpSetGroupWeight(true))))
	mux.HandleFunc("DELETE /v1/queues/{queue}/group-weights/{group}",
		g.audited(weights.ActionGroupWeightClear, "group", g.operator(auth.WeightsWrite, g.httpSetGroupWeight(false))))
}

// operatorOnly answers 403 to a tenant's token on a route that changes how
// a queue is shared.
func operatorOnly(w http.ResponseWriter, p auth.Principal, what string) bool {
	if p.Tenant == "" {
		return true
	}
	writeError(w, api.NewError(api.CodePermissionDenied,
		"token %q belongs to tenant %q: %s applies to every tenant of the queue, so only an operator's token (no tenant) may change it",
		p.Name, p.Tenant, what))
	return false
}

func (g *Gateway) httpGetFairness(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if !knownQuery(w, r) {
		return
	}
	res, err := weights.Fairness(r.Context(), g.weightShards(), r.PathValue("queue"), g.readOpts(p)...)
	if err != nil {
		writeError(w, g.apiError(err, 0, "get queue fairness"))
		return
	}
	writeJSON(w, res.Status(), res)
}

func (g *Gateway) httpSetFairness(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if !knownQuery(w, r) || !operatorOnly(w, p, "a queue's fairness mode") {
		return
	}
	body, e := g.readObject(w, r, reflect.TypeFor[api.QueueFairnessRequest]())
	if e != nil {
		writeError(w, e)
		return
	}
	var req api.QueueFairnessRequest
	if err := weights.DecodeStrict(bytes.NewReader(body), &req); err != nil {
		writeError(w, g.apiError(err, 0, "set queue fairness"))
		return
	}
	res, err := weights.SetFairness(r.Context(), g.weightShards(), p.Name, r.PathValue("queue"), req, g.weightOpts()...)
	if err != nil {
		writeError(w, g.apiError(err, 0, "set queue fairness"))
		return
	}
	if n := len(res.UnavailableShards); n > 0 {
		g.log.Warn("gateway: a fairness change did not reach every shard", "queue", res.Queue,
			"unavailable", fmt.Sprint(res.UnavailableShards))
	}
	writeJSON(w, res.Status(), res)
}

// httpSetGroupWeight is PUT (set) or DELETE of a group's weight.
func (g *Gateway) httpSetGroupWeight(set bool) principalHandler {
	return func(w http.ResponseWriter, r *http.Request, p auth.Principal) {
		if !knownQuery(w, r) || !operatorOnly(w, p, "a group's weight") {
			return
		}
		var weight *float64
		if set {
			body, e := g.readObject(w, r, reflect.TypeFor[api.WeightBody]())
			if e != nil {
				writeError(w, e)
				return
			}
			v, err := weights.DecodeWeightBody(bytes.NewReader(body))
			if err != nil {
				writeError(w, g.apiError(err, 0, "set group weight"))
				return
			}
			weight = &v
		}
		res, err := weights.SetGroupWeight(r.Context(), g.weightShards(), p.Name, r.PathValue("queue"), r.PathValue("group"), weight, g.weightOpts()...)
		if err != nil {
			writeError(w, g.apiError(err, 0, "set group weight"))
			return
		}
		writeJSON(w, res.Status(), res)
	}
}
