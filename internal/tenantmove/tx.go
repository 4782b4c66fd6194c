package tenantmove

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// txAttempts bounds the retries of a step the database broke on purpose
// (a deadlock with a claim or a cancel, a serialization failure): the
// broken attempt was rolled back whole, so the next starts afresh.
const txAttempts = 8

// retryable reports a transaction the database broke to resolve a lock
// cycle or a serialization conflict.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}

// inTx runs fn in a transaction on db and commits it, again when the
// database broke the attempt.
func inTx(ctx context.Context, db *pgxpool.Pool, fn func(pgx.Tx) error) error {
	for attempt := 1; ; attempt++ {
		err := pgx.BeginFunc(ctx, db, fn)
		if err == nil || !retryable(err) || attempt == txAttempts || ctx.Err() != nil {
			return err
		}
	}
}

// tenantRe is the shape of a tenant name: the characters a NATS subject
// and a gateway token carry without escaping. No package of the module
// validates tenant names yet, so the rule lives here.
var tenantRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

func validTenant(tenant string) error {
	if !tenantRe.MatchString(tenant) {
		return fmt.Errorf("tenantmove: tenant %q: must be 1 to 128 of A-Z, a-z, 0-9, '_' and '-'", tenant)
	}
	return nil
}

// subKeys is the LIKE pattern of the keys under "<tenant>/", with the LIKE
// characters of the name escaped ('_' is one of them).
func subKeys(tenant string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return r.Replace(tenant) + "/%"
}
