package schema_test

import (
	"context"
	"regexp"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
)

// The statuses the schema lets a run have are api.Statuses, no more and no
// fewer: the Go list is the one the filters and the console check against,
// so a status added on one side only would be refused by the other. The
// constraint is read from a migrated database, so every migration that
// redefines it is covered.
func TestRunStatusCheckIsTheGoList(t *testing.T) {
	t.Parallel()
	db := testsvc.NewDB(t)
	rows, err := db.Query(context.Background(), `
		SELECT pg_get_constraintdef(c.oid)
		FROM pg_constraint c
		JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
		WHERE c.conrelid = 'runs'::regclass AND c.contype = 'c' AND a.attname = 'status'`)
	require.NoError(t, err)
	defs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, defs, 1, "one CHECK constraint on runs.status: %q", defs)

	var inSQL []api.Status
	for _, m := range regexp.MustCompile(`'([^']*)'::text`).FindAllStringSubmatch(defs[0], -1) {
		inSQL = append(inSQL, api.Status(m[1]))
	}
	require.ElementsMatch(t, api.Statuses(), inSQL, "runs.status CHECK: %s", defs[0])
}
