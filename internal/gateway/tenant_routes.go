package gateway

import (
	"context"
	"net/http"
	"time"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// tenantRoutes adds the per-tenant settings of operators:
//
//	GET    /v1/tenants/{tenant}/priority   config:read
//	PUT    /v1/tenants/{tenant}/priority   config:write
//	DELETE /v1/tenants/{tenant}/priority   config:write
//
// The ceiling is the highest priority the tenant's starts may carry
// (pkg/tenantcap/priority.go); tenant tokens can never hold the config
// privileges, so no tenant reads or raises its own.
func (g *Gateway) tenantRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/tenants/{tenant}/priority", g.operator(auth.ConfigRead, g.httpGetCeiling))
	mux.HandleFunc("PUT /v1/tenants/{tenant}/priority",
		g.audited(tenantcap.PriorityAction, "tenant", g.operator(auth.ConfigWrite, g.httpSetCeiling)))
	mux.HandleFunc("DELETE /v1/tenants/{tenant}/priority",
		g.audited(tenantcap.PriorityAction, "tenant", g.operator(auth.ConfigWrite, g.httpClearCeiling)))
}

func (g *Gateway) httpGetCeiling(w http.ResponseWriter, r *http.Request, _ auth.Principal) {
	if !knownQuery(w, r) {
		return
	}
	tenant := r.PathValue("tenant")
	if err := auth.ValidateTenant(tenant); err != nil {
		writeError(w, api.Invalid("tenant", "%v", err))
		return
	}
	// Read from shard 0, not the cache: an operator checking a change it
	// just made on another gateway sees it.
	ceilings, err := tenantcap.LoadCeilings(r.Context(), g.shards[0])
	if err != nil {
		writeError(w, g.apiError(err, 0, "priority ceiling"))
		return
	}
	writeJSON(w, http.StatusOK, ceilings.Ceiling(tenant))
}

func (g *Gateway) httpSetCeiling(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if !knownQuery(w, r) {
		return
	}
	body, e := g.readBody(w, r)
	if e != nil {
		writeError(w, e)
		return
	}
	maxPriority, err := tenantcap.ParseCeilingPut(body)
	if err == nil {
		var c api.PriorityCeiling
		if c, err = tenantcap.SetCeiling(r.Context(), g.shards[0], p.Name, r.PathValue("tenant"), maxPriority); err == nil {
			g.ceilingChanged(r.Context(), c)
			writeJSON(w, http.StatusOK, c)
			return
		}
	}
	writeError(w, g.apiError(err, 0, "priority ceiling"))
}

func (g *Gateway) httpClearCeiling(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if !knownQuery(w, r) {
		return
	}
	c, err := tenantcap.ClearCeiling(r.Context(), g.shards[0], p.Name, r.PathValue("tenant"))
	if err != nil {
		writeError(w, g.apiError(err, 0, "priority ceiling"))
		return
	}
	g.ceilingChanged(r.Context(), c)
	writeJSON(w, http.StatusOK, c)
}

// ceilingChanged puts a committed ceiling change in force on this gateway
// at once and announces it, so the others re-read shard 0 before their
// next start (or within HARVEST_ADMISSION_RELOAD should the message be
// lost).
func (g *Gateway) ceilingChanged(ctx context.Context, c api.PriorityCeiling) {
	if err := g.adm.watcher.Reload(ctx); err != nil {
		g.log.Warn("admission: priority ceiling saved but not re-read here; in force at the next reload", "err", err)
	}
	if g.nc == nil {
		return
	}
	if err := tenantcap.PublishCeilings(ctx, g.nc, g.cfg.SubjectPrefix, c); err != nil {
		g.log.Warn("admission: priority ceiling saved but not announced; other gateways apply it at their next periodic reload", "err", err)
	} else if err := g.nc.FlushTimeout(2 * time.Second); err != nil {
		g.log.Warn("admission: flush announcement", "err", err)
	}
}
