package pgrow_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/pgrow"
	"github.com/harvest-run/harvest/internal/testsvc"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

type pair struct {
	N    int    `db:"n"`
	Name string `db:"name"`
}

// Columns land in fields by name whatever their order, and a column
// without a field (or a field without a column) fails the read.
func TestReadsByName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testsvc.NewDB(t)

	p, err := pgrow.One[pair](ctx, db, `SELECT 'a' AS name, 1 AS n`)
	require.NoError(t, err)
	require.Equal(t, pair{N: 1, Name: "a"}, p)

	_, err = pgrow.One[pair](ctx, db, `SELECT 1 AS n WHERE false`)
	require.ErrorIs(t, err, pgx.ErrNoRows)

	_, err = pgrow.One[pair](ctx, db, `SELECT 1 AS n, 'a' AS name, 2 AS extra`)
	require.Error(t, err, "a column the struct does not name")
	_, err = pgrow.One[pair](ctx, db, `SELECT 1 AS n`)
	require.Error(t, err, "a field the row does not have")

	all, err := pgrow.All[pair](ctx, db, `SELECT g AS n, 'x' || g AS name FROM generate_series(1, 3) g ORDER BY g`)
	require.NoError(t, err)
	require.Equal(t, []pair{{1, "x1"}, {2, "x2"}, {3, "x3"}}, all)
}
