// Package console is the browser console every gateway serves under
// /admin: server-rendered pages (html/template, embedded from templates/)
// behind a sign-in with a bearer token, for operators and for tenants.
//
// It holds both halves of the console, so that whoever opens it finds the
// pages and what they read:
//
//   - The reads: runs across every shard with a cursor (runs.go), one run
//     with its tasks and trace id, queue depths by state (queues.go) and the
//     claims of each fairness key over the last minutes (shares.go). They
//     only read, from the shards' pools, with their statements in sql/.
//   - The pages: their routes and rendering (pages.go), sign-in and
//     sign-out (signin.go) over sessions held in memory (session.go), the
//     admission page (admission.go), the runs and queues pages
//     (runpages.go, queuepages.go, fairness.go) and the share chart, an
//     inline SVG drawn on the server (chart.go).
//
// The reads and the pages are one package because the reads exist for the
// pages alone; a package of pages apart from them would only pass their
// results along.
//
// What the pages need of the gateway is the Backend interface: the tokens,
// the admission in force, the tenant directory, and every action (saving
// admission, a priority ceiling, cancelling or retrying a run, pausing a
// queue, changing its fairness). The actions go through the gateway so that
// a change made in a browser takes the same path as one made through the
// API: checked, audited, in force at once and announced to the other
// gateways. The console keeps no state besides its sessions; the gateway
// makes one Console and mounts it at /admin, behind its body cap
// (MaxFormBytes).
package console
