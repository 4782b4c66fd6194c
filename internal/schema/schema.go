package schema

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/pkg/shard"
)

//go:embed migrations/*.sql functions/*.sql
var files embed.FS

// lockKey is the advisory lock every migrating process takes, so that two
// binaries starting at once apply each migration exactly once.
const lockKey int64 = 0x4841525645535431 // "HARVEST1"

// Migration is one numbered SQL file.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Function is one file of functions/: a function, and its trigger when it
// is a trigger function.
type Function struct {
	Name string
	SQL  string
}

// Migrations returns the embedded migrations in the order they apply.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(files, "migrations")
	if err != nil {
		return nil, fmt.Errorf("schema: read migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		if !ok || !strings.HasSuffix(name, ".sql") {
			return nil, fmt.Errorf("schema: migration file %q: want NNNN_name.sql", name)
		}
		v, err := strconv.Atoi(num)
		if err != nil {
			return nil, fmt.Errorf("schema: migration file %q: bad version: %w", name, err)
		}
		body, err := files.ReadFile(path.Join("migrations", name))
		if err != nil {
			return nil, fmt.Errorf("schema: read %s: %w", name, err)
		}
		out = append(out, Migration{Version: v, Name: strings.TrimSuffix(name, ".sql"), SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("schema: two migrations with version %d", out[i].Version)
		}
	}
	return out, nil
}

// Functions returns the embedded function files in name order.
func Functions() ([]Function, error) {
	entries, err := fs.ReadDir(files, "functions")
	if err != nil {
		return nil, fmt.Errorf("schema: read functions: %w", err)
	}
	out := make([]Function, 0, len(entries))
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".sql")
		if !ok {
			return nil, fmt.Errorf("schema: function file %q: want <name>.sql", e.Name())
		}
		body, err := files.ReadFile(path.Join("functions", e.Name()))
		if err != nil {
			return nil, fmt.Errorf("schema: read %s: %w", e.Name(), err)
		}
		out = append(out, Function{Name: name, SQL: string(body)})
	}
	return out, nil
}

// functionsDigest identifies the text of every function file, so that an
// unchanged set is not applied again (which would make every session
// re-plan its statements).
func functionsDigest(fns []Function) string {
	h := sha256.New()
	for _, f := range fns {
		fmt.Fprintf(h, "%s\x00%d\x00%s", f.Name, len(f.SQL), f.SQL)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Latest is the version a fully migrated shard reports.
func Latest() int {
	ms, err := Migrations()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

// ErrPreBaseline is returned by Migrate for a shard whose schema was made
// by a development build from before the migrations were squashed into one
// baseline: nothing was released then, so such a shard is recreated rather
// than upgraded.
var ErrPreBaseline = errors.New("schema: the shard was created by a development build older than the schema baseline; drop and recreate its database")

// Migrate applies every migration the shard lacks and then every function
// whose text changed, in one transaction under an advisory lock, and
// returns the shard's version afterwards. Running it on an up-to-date shard
// changes nothing. A shard already migrated by a newer release reports its
// newer version and is left alone, functions included: migrations are
// additive, so an older binary keeps running against it.
func Migrate(ctx context.Context, db shard.Beginner) (int, error) {
	ms, err := Migrations()
	if err != nil {
		return 0, err
	}
	fns, err := Functions()
	if err != nil {
		return 0, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("schema: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after commit

	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey); err != nil {
		return 0, fmt.Errorf("schema: take migration lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return 0, fmt.Errorf("schema: create schema_migrations: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_functions (
		one        boolean     PRIMARY KEY DEFAULT true CHECK (one),
		digest     text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return 0, fmt.Errorf("schema: create schema_functions: %w", err)
	}
	rows, err := tx.Query(ctx, `SELECT version, name FROM schema_migrations`)
	if err != nil {
		return 0, fmt.Errorf("schema: read applied versions: %w", err)
	}
	type applied struct {
		Version int32
		Name    string
	}
	done, err := pgx.CollectRows(rows, pgx.RowToStructByName[applied])
	if err != nil {
		return 0, fmt.Errorf("schema: read applied versions: %w", err)
	}
	names := map[int]string{}
	for _, m := range ms {
		names[m.Version] = m.Name
	}
	have := map[int]bool{}
	version := 0
	for _, a := range done {
		v := int(a.Version)
		if n, ok := names[v]; ok && n != a.Name {
			return 0, fmt.Errorf("%w (it records migration %d as %q, this build has %q)", ErrPreBaseline, v, a.Name, n)
		}
		have[v] = true
		version = max(version, v)
	}
	newer := version > Latest()
	for _, m := range ms {
		if have[m.Version] {
			continue
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return 0, fmt.Errorf("schema: apply %s: %w", m.Name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
			return 0, fmt.Errorf("schema: record %s: %w", m.Name, err)
		}
		version = max(version, m.Version)
	}
	if !newer {
		if err := applyFunctions(ctx, tx, fns); err != nil {
			return 0, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("schema: commit: %w", err)
	}
	return version, nil
}

// applyFunctions (re)creates every function and trigger when the set
// changed since it was last applied. Bodies are not checked at creation
// (check_function_bodies off), since a function may call one whose file
// comes later; the tests call every one of them.
func applyFunctions(ctx context.Context, tx pgx.Tx, fns []Function) error {
	digest := functionsDigest(fns)
	var current string
	err := tx.QueryRow(ctx, `SELECT digest FROM schema_functions`).Scan(&current)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("schema: read functions digest: %w", err)
	}
	if current == digest {
		return nil
	}
	if _, err := tx.Exec(ctx, `SET LOCAL check_function_bodies = off`); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	names := make([]string, len(fns))
	for i, f := range fns {
		if _, err := tx.Exec(ctx, f.SQL); err != nil {
			return fmt.Errorf("schema: apply function %s: %w", f.Name, err)
		}
		names[i] = f.Name
	}
	// A function whose file is gone is dropped, so the shard holds exactly
	// the functions of the tree.
	rows, err := tx.Query(ctx, `SELECT p.oid::regprocedure::text FROM pg_proc p
		WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'harvest\_%'
		  AND p.proname <> ALL ($1::text[])`, names)
	if err != nil {
		return fmt.Errorf("schema: list functions: %w", err)
	}
	stale, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("schema: list functions: %w", err)
	}
	for _, fn := range stale {
		if _, err := tx.Exec(ctx, "DROP FUNCTION "+fn); err != nil {
			return fmt.Errorf("schema: drop function %s, whose file is gone: %w", fn, err)
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO schema_functions (digest) VALUES ($1)
		ON CONFLICT (one) DO UPDATE SET digest = excluded.digest, applied_at = now()`, digest); err != nil {
		return fmt.Errorf("schema: record functions digest: %w", err)
	}
	return nil
}
