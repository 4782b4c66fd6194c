// Package natsauth writes the nats-server configuration that keeps
// Harvest's tenants apart on NATS.
//
// Over NATS, the tenant of a start is the last token of its subject
// (<prefix>.start.<tenant>), so whoever may publish there acts as that
// tenant. The server's own per-user permissions enforce it: Config renders
// an authorization block with three kinds of users.
//
//   - Service users (gateways, workers) may publish and subscribe anywhere,
//     which includes answering a tenant's request in its inbox.
//   - Handler users (services that run workflow code for the stock worker)
//     may subscribe to <prefix>.handle.> and publish only the answers to
//     the requests they received.
//   - Tenant users may publish only <prefix>.start.<tenant> and
//     <prefix>.start_batch.<tenant>, and subscribe only to their inbox
//     prefix (InboxPrefix: "_INBOX_<tenant>.>") and to their run events
//     (<prefix>.runs.<tenant>.>). The shared "_INBOX.>" is closed to them,
//     so no tenant can read another's replies.
//
// A tenant client therefore connects with its tenant user and sets its
// inbox prefix, for example in Go:
//
//	nc, err := nats.Connect(url,
//		nats.UserInfo("acme", password),
//		nats.CustomInboxPrefix(natsauth.InboxPrefix("acme")))
//
// Without the custom prefix the client's requests time out and it is sent
// a permissions error for its "_INBOX." subscription. With the `nats`
// command-line tool, pass --inbox-prefix _INBOX_acme.
//
// On a cluster (Options.Cluster) every node loads a file made from the
// same Options, so the users and their permissions are the same on each
// node: a tenant connected to one node is held to its subjects there, and
// the answers to its requests reach its own inbox over the routes whichever
// node the gateway that answered is on. The nodes take routes only from
// one another (a route user and password).
//
// Passwords may be written in clear (Plain), as bcrypt hashes (Bcrypt), or
// as references to environment variables (Env) that the server resolves
// when it loads the file, which is how deploy/nats/nats.conf keeps
// passwords out of the repository.
package natsauth
