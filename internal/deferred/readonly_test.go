package deferred_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
)

// A deferred start whose transaction reached a server that had stopped
// being the primary (SQLSTATE 25006: the whole transaction was refused) is
// sent again, like one the database broke on purpose: the pool has closed
// that connection, so the next attempt reaches the new primary. Here the
// first attempt's insert is answered 25006 by a trigger, once.
func TestReadOnlyAnswerIsTriedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.db.Exec(b.ctx, `
		CREATE SEQUENCE test_read_only_once;
		CREATE FUNCTION test_read_only_once() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN
			IF nextval('test_read_only_once') = 1 THEN
				RAISE EXCEPTION 'cannot execute INSERT in a read-only transaction' USING ERRCODE = '25006';
			END IF;
			RETURN NULL;
		END $$;
		CREATE TRIGGER test_read_only_once BEFORE INSERT ON deferred_groups
			FOR EACH STATEMENT EXECUTE FUNCTION test_read_only_once()`)
	require.NoError(t, err)

	res := b.start(startOpts{ID: "d1", Debounce: `{"period": "1m"}`})
	require.Equal(t, api.StatusDeferred, res.Run.Status)
	require.Equal(t, 2, b.scalar(`SELECT last_value FROM test_read_only_once`), "the first attempt was refused, the second taken")
	require.Equal(t, 1, b.scalar(`SELECT count(*) FROM deferred_groups`))
}
