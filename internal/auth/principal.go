package auth

import (
	"errors"
	"strings"
)

// MaxSecretLen bounds the bearer secrets Authenticate will hash; anything
// longer is refused without being looked at.
const MaxSecretLen = 1024

// ErrUnauthenticated matches every authentication failure: a missing or
// unknown bearer token. The gateway answers 401 to it.
var ErrUnauthenticated = errors.New("auth: unauthenticated")

// ErrMissingToken reports a request without a bearer token.
var ErrMissingToken error = unauthenticated("no bearer token")

// ErrUnknownToken reports a bearer token that matches no entry of the
// tokens file in force.
var ErrUnknownToken error = unauthenticated("unknown bearer token")

// unauthenticated is a specific authentication failure that also matches
// ErrUnauthenticated.
type unauthenticated string

func (e unauthenticated) Error() string        { return "auth: " + string(e) }
func (e unauthenticated) Is(target error) bool { return target == ErrUnauthenticated }

// Principal is who a request acts as once its token is known.
//
// The zero Principal (what Authenticate returns with an error) holds no
// privilege and is not an administrator.
type Principal struct {
	// Name is the token's name, for logs and audit rows.
	Name string
	// Tenant is the tenant the token acts for; empty for an administrator.
	Tenant string
	// Privileges are what the token may do.
	Privileges Privileges
}

// Admin reports whether the principal is an administrator: an
// authenticated token bound to no tenant.
func (p Principal) Admin() bool { return p.Name != "" && p.Tenant == "" }

// Has reports whether the principal holds privilege priv.
func (p Principal) Has(priv Privilege) bool { return p.Privileges.Has(priv) }

// BearerToken takes the secret out of an HTTP Authorization header value
// of the form "Bearer <secret>" (the scheme is case-insensitive). It
// reports false when the header is empty, uses another scheme or carries
// no secret.
func BearerToken(header string) (string, bool) {
	scheme, secret, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	secret = strings.TrimSpace(secret)
	return secret, secret != ""
}
