// Package auth decides who a gateway request acts as: it reads the tokens
// file, checks bearer secrets against it and keeps it current while the
// gateway runs.
//
// # Privileges
//
// A token holds some of six privileges: runs:start, runs:read,
// weights:read, weights:write, config:read and config:write. The two config
// privileges belong to administrators only.
//
// # The tokens file
//
// The file is a JSON array with one object per token. This example (also
// in testdata/tokens.example.json) has a tenant token for acme's CI and an
// administrator token; its secrets are "acme-ci-example-secret" and
// "ops-example-secret", which real files must never use:
//
//	[
//	  {"name": "acme-ci", "tenant": "acme",
//	   "sha256": "b9b1a508e660c64a79d3cf5300b3644264b644e2c5dda7600c8e010f3959f011",
//	   "privileges": ["runs:start", "runs:read"]},
//	  {"name": "ops",
//	   "sha256": "ce9468162cb25914f53894a4e25a6fe486ba8d7603c3f5420fd52243132067b2",
//	   "privileges": ["runs:read", "weights:read", "weights:write", "config:read", "config:write"]}
//	]
//
// The fields:
//
//   - name (required): identifies the token in logs and audit rows; 1 to
//     128 characters from A-Z, a-z, 0-9, '_', '-', '.' and '@'; unique in
//     the file.
//   - sha256 (required): the hex SHA-256 of the secret (64 digits, either
//     case), as HashSecret computes it; unique in the file. The secret
//     itself is never written down.
//   - tenant (optional): the tenant the token acts for, 1 to 64 characters
//     from A-Z, a-z, 0-9, '_' and '-'. Absent or empty makes an
//     administrator token, which belongs to no tenant.
//   - privileges (required, not empty): names from the list above, each at
//     most once.
//
// Any other field is an error. A file with a bad entry is refused as a
// whole, with an error that names the entry (its index from 0 and its
// name) and the field. In particular a tenant-bound token listing
// config:read or config:write makes the whole file invalid, as do two
// entries sharing a name or a hash. An empty array is a valid file that
// lets nobody in.
//
// The registered tenants (TokenSet.Tenants) are the distinct tenants of the
// tenant-bound tokens; administrator tokens do not count.
//
// # Secrets
//
// NewSecret makes secrets such as "hv_3q2-…" (the prefix, then 32 random
// bytes in URL-safe base64). A new token is added by making a secret,
// giving it to its owner, and adding its HashSecret to the file. Because
// each secret has 256 bits of entropy, a single unsalted SHA-256 is a safe
// way to store it, and lookups can go by hash.
//
// # Reloading
//
// Store holds the set in force. Store.Watch polls the file and re-reads it
// on request (SignalRequests turns SIGHUP into requests); a valid new
// version replaces the set at once, a bad one is reported and ignored, so
// tokens can be added and rotated without restarting. To rotate a secret,
// add a second entry for the new secret, hand it out, then remove the old
// entry.
package auth
