package tenantmove

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/internal/auth"
)

// txAttempts bounds the retries of a step the database broke on purpose
// (a deadlock with a claim or a cancel, a serialization failure): the
// broken attempt was rolled back whole, so the next starts afresh.
const txAttempts = 8

// retryable reports a transaction the database broke to resolve a lock
// cycle or a serialization conflict, or refused whole because the server
// stopped being the primary (25006: the pool closed that connection, and
// the next attempt connects to the new primary or fails to connect).
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001" || pe.Code == "25006")
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
