// Package gateway is the door through which runs enter Harvest: an HTTP
// API and a NATS request-reply service that start, read, list and cancel
// runs, each on the tenant's home shard.
//
// A gateway keeps no state of its own. Every start is checked (strict JSON,
// the rules of api.StartRequest, an optional key binding and authorizer
// hook), routed to the home shard of its tenant, and written there by a
// runstore.Committer, which gathers concurrent starts into shared
// transactions (group commit) with a savepoint per start. Once a group has
// committed, the gateway publishes a wake-up for each queue that got work
// and a dispatch for each new task whose queue had no backlog; a publish
// that fails costs latency, never a start.
//
// A deferred start (throttle, debounce, batch) is not group-committed: it
// goes to deferred.Start in a transaction of its own, with the same
// admitter, and the runs it starts at once are announced the same way.
// Reads and cancels of an id go through internal/deferred too, so a
// deferred start's id resolves to the run it stands for (see
// docs/deferred.md).
//
// Every new run passes tenant admission inside its start transaction
// (pkg/tenantcap: the read-only system limit HARVEST_MAX_RUNS and the
// algorithm and TFM stored on shard 0, watched over NATS). Every rule of
// admission is in pkg/tenantcap, whose doc says where each part lives; the
// gateway's admission.go only wires it in: it builds and runs tenantcap's
// Admitter, totals, leases and watcher, refuses new runs with 503 until the
// configuration is loaded, counts the decisions and serves the admission
// routes.
//
// Operators manage weight overrides, quotas, admission and the audit log
// through the routes of admin_routes.go, or in a browser at /admin: the
// console (internal/console), which the gateway mounts and serves
// (console.go).
//
// Over HTTP the caller is known by its bearer token (internal/auth); over
// NATS the tenant is the last token of the subject and the NATS server's
// permissions (internal/natsauth) decide who may publish there. Both
// transports answer with the same JSON: the run, or {"error": {...}} with
// the HTTP status inside.
package gateway
