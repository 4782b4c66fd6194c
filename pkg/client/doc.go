// Package client is the typed Go client of Harvest's gateway API.
//
// Starts go over NATS request-reply when the client has a NATS connection
// (the gateways' queue group answers), otherwise over HTTP; reading,
// listing and cancelling runs go over HTTP. Both transports return the same
// types, and every refusal is an *Error wrapping the *api.Error with the
// HTTP status and the error code, so callers handle them alike: with
// errors.Is and the sentinels (ErrOverLimit, ErrNotFound, ErrUnavailable,
// ErrUnauthorized, ErrForbidden, ErrConflict, ErrInvalid), or errors.As
// for the code and message:
//
//	c, err := client.New(client.Options{URL: "http://gateway:8080", Token: secret})
//	st, err := c.Start(ctx, "resize", "images", map[string]any{"src": "a.png"},
//		client.StartOptions{FairnessKey: "customer-42"})
//	run, err := c.Wait(ctx, st.Run.ID, 30*time.Second)
//
// The client names every start (a UUIDv7 when the caller gave no id)
// before sending it, and the gateway answers a repeated start with the run
// it made, so starts are safe to send again. Options.Retry opts in to doing
// that on 429 and 503 answers and lost connections (see RetryPolicy). HTTP
// calls carry the caller's W3C trace context, as NATS messages do.
//
// Over NATS a tenant's client must use the tenant's inbox prefix, which the
// NATS server's permissions require (see internal/natsauth):
//
//	nc, err := nats.Connect(url, nats.UserInfo("acme", pw),
//		nats.CustomInboxPrefix("_INBOX_acme"))
//	c, err := client.New(client.Options{NATS: nc, Tenant: "acme"})
//
// Operators use the same client with an administrator token for the
// installation-wide routes: weight overrides and quotas on every shard
// (GetWeights, SetWeight, ClearWeight, GetQuota, SetQuota, ClearQuota,
// Keys), the audit log (Audit), and tenant admission (Admission,
// SetAdmission). A tenant reads its own count and limit with Usage.
package client
