package tenantmove

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
)

// A step whose transaction reached a server that had stopped being the
// primary (SQLSTATE 25006: the whole transaction was refused) is run again,
// like one the database broke on purpose: the pool has closed that
// connection, so the next attempt reaches the new primary. Here the first
// attempt is answered 25006 by a function, once.
func TestReadOnlyAnswerIsTriedAgain(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := testsvc.NewDB(t)
	_, err := db.Exec(ctx, `
		CREATE SEQUENCE test_read_only_once;
		CREATE FUNCTION test_read_only_once() RETURNS bigint LANGUAGE plpgsql AS
		$$ DECLARE n bigint := nextval('test_read_only_once'); BEGIN
			IF n = 1 THEN
				RAISE EXCEPTION 'cannot execute INSERT in a read-only transaction' USING ERRCODE = '25006';
			END IF;
			RETURN n;
		END $$`)
	require.NoError(t, err)

	var got int64
	require.NoError(t, inTx(ctx, db, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT test_read_only_once()`).Scan(&got)
	}))
	require.EqualValues(t, 2, got, "the first attempt was refused, the second taken")
}
