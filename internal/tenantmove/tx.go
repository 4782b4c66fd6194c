package tenantmove

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/dberr"
)

// txAttempts bounds the retries of a step the database broke on purpose
// (a deadlock with a claim or a cancel, a serialization failure) or
// refused whole because the server stopped being the primary
// (dberr.Retryable): the broken attempt was rolled back whole, so the next
// starts afresh. A move has no caller waiting to be answered 503, so it
// rides out a switchover itself.
const txAttempts = 8

// inTx runs fn in a transaction on db and commits it, again when the
// database broke the attempt.
func inTx(ctx context.Context, db *pgxpool.Pool, fn func(pgx.Tx) error) error {
	for attempt := 1; ; attempt++ {
		err := pgx.BeginFunc(ctx, db, fn)
		if err == nil || !dberr.Retryable(err) || attempt == txAttempts || ctx.Err() != nil {
			return err
		}
	}
}

// validTenant applies the tenant-name rule of the tokens file
// (auth.ValidateTenant), naming the tenant.
func validTenant(tenant string) error {
	if err := auth.ValidateTenant(tenant); err != nil {
		return fmt.Errorf("tenantmove: tenant %q: %w", tenant, err)
	}
	return nil
}

// subKeys is the LIKE pattern of the keys under "<tenant>/", with the LIKE
// characters of the name escaped ('_' is one of them).
func subKeys(tenant string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return r.Replace(tenant) + "/%"
}
