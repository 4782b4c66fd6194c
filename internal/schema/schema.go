package schema

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
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

// Latest is the version a fully migrated shard reports.
func Latest() int {
	ms, err := Migrations()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

// Beginner is what Migrate needs of a connection or pool.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migrate applies every migration the shard lacks, in one transaction under
// an advisory lock, and returns the shard's version afterwards. Running it on
// an up-to-date shard changes nothing. A shard already migrated by a newer
// release reports its newer version and is left alone: migrations are
// additive, so an older binary keeps running against it.
func Migrate(ctx context.Context, db Beginner) (int, error) {
	ms, err := Migrations()
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
	applied := map[int]bool{}
	rows, err := tx.Query(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return 0, fmt.Errorf("schema: read applied versions: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return 0, fmt.Errorf("schema: read applied versions: %w", err)
	}
	version := 0
	for _, v := range versions {
		applied[int(v)] = true
		version = max(version, int(v))
	}
	for _, m := range ms {
		if applied[m.Version] {
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
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("schema: commit: %w", err)
	}
	return version, nil
}
