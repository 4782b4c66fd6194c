package fairkeys

import "strings"

// Key binding names a tenant's keys after the tenant, so that no tenant can
// take another's weight or quota: no key becomes the tenant's name, key k
// becomes "<tenant>/k". Bound and BoundTo are the one statement of that
// rule, for the gateway that binds and for the reads that show a tenant
// its own keys.

// Bound is key k of tenant as binding names it ("" for no key).
func Bound(tenant, k string) string {
	if k == "" {
		return tenant
	}
	return tenant + "/" + k
}

// BoundTo reports whether key is one that binding gives tenant's runs.
func BoundTo(key, tenant string) bool {
	return key == tenant || strings.HasPrefix(key, tenant+"/")
}
