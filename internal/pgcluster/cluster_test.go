package pgcluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestStartQueryStop(t *testing.T) {
	t.Parallel()
	if _, err := FindBinaries(); err != nil {
		t.Skipf("no PostgreSQL server binaries: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	c, err := Start(ctx, Options{Logf: t.Logf, Settings: map[string]string{"application_name": "pgcluster test"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	require.NotZero(t, c.Port())
	require.DirExists(t, c.Dir())
	require.Contains(t, c.URL("postgres"), "127.0.0.1:")

	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	require.NoError(t, err)
	var one int
	require.NoError(t, conn.QueryRow(ctx, "SELECT 1").Scan(&one))
	require.Equal(t, 1, one)
	var maxConns, fsync string
	require.NoError(t, conn.QueryRow(ctx, "SHOW max_connections").Scan(&maxConns))
	require.NoError(t, conn.QueryRow(ctx, "SHOW fsync").Scan(&fsync))
	require.Equal(t, "200", maxConns)
	require.Equal(t, "off", fsync)
	require.NoError(t, conn.Close(ctx))

	require.NoError(t, c.Stop(ctx))
	require.NoDirExists(t, c.Dir())
	require.NoError(t, c.Stop(ctx), "Stop is idempotent")
}

func TestStartFailureCleansUp(t *testing.T) {
	t.Parallel()
	if _, err := FindBinaries(); err != nil {
		t.Skipf("no PostgreSQL server binaries: %v", err)
	}
	parent, err := os.MkdirTemp("", "pgcluster-fail-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(parent) })
	if os.Geteuid() == 0 {
		// The unprivileged server user must be able to reach the cluster.
		require.NoError(t, os.Chmod(parent, 0o755))
	}

	_, err = Start(t.Context(), Options{
		Dir:      parent,
		Settings: map[string]string{"no_such_setting": "1"},
	})
	require.Error(t, err)
	require.Contains(t, err.Error(), "no_such_setting", "the error carries the server log")
	entries, err := os.ReadDir(parent)
	require.NoError(t, err)
	require.Empty(t, entries, "a failed Start removes its directory")
}

func TestFindBinariesNotFound(t *testing.T) {
	t.Parallel()
	_, err := findBinaries("", []string{t.TempDir()})
	require.Error(t, err)
	require.True(t, errors.Is(err, ErrBinariesNotFound))
	msg := err.Error()
	for _, want := range []string{"initdb", "pg_ctl", "apt-get install postgresql", "deploy/compose.yaml",
		"HARVEST_TEST_DATABASE_URL", "HARVEST_DATABASE_URL"} {
		require.Contains(t, msg, want)
	}
}

func fakeBinDir(t *testing.T, dir string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for _, name := range requiredBinaries {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), 0o755))
	}
}

func TestFindBinariesNewestVersionFirst(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	for _, v := range []string{"9.6", "15", "16", "notaversion"} {
		fakeBinDir(t, filepath.Join(root, v, "bin"))
	}
	// A version directory without the binaries is skipped.
	require.NoError(t, os.MkdirAll(filepath.Join(root, "17", "bin"), 0o755))

	dir, err := findBinaries("", []string{filepath.Join(t.TempDir(), "missing"), root})
	require.NoError(t, err)
	require.Equal(t, filepath.Join(root, "16", "bin"), dir)
}

func TestFindBinariesPathFirst(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	fakeBinDir(t, filepath.Join(root, "16", "bin"))

	// initdb on PATH as a symlink into a complete install directory.
	real := filepath.Join(t.TempDir(), "real")
	fakeBinDir(t, real)
	onPath := t.TempDir()
	require.NoError(t, os.Symlink(filepath.Join(real, "initdb"), filepath.Join(onPath, "initdb")))

	empty := t.TempDir()
	dir, err := findBinaries(strings.Join([]string{"", empty, onPath}, string(os.PathListSeparator)), []string{root})
	require.NoError(t, err)
	require.Equal(t, real, dir)

	// A PATH entry with only some of the binaries does not count.
	partial := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(partial, "initdb"), nil, 0o755))
	dir, err = findBinaries(partial, []string{root})
	require.NoError(t, err)
	require.Equal(t, filepath.Join(root, "16", "bin"), dir)
}

func TestCheckTraversable(t *testing.T) {
	t.Parallel()
	const uid, gid = 54321, 54321 // owns nothing here
	// t.TempDir's own parent is private, so build the tree under os.TempDir.
	open, err := os.MkdirTemp("", "pgcluster-trav-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(open) })
	require.NoError(t, os.Chmod(open, 0o755))
	require.NoError(t, checkTraversable(open, uid, gid))

	closed := filepath.Join(open, "closed")
	require.NoError(t, os.Mkdir(closed, 0o700))
	inner := filepath.Join(closed, "inner")
	require.NoError(t, os.Mkdir(inner, 0o755))
	err = checkTraversable(inner, uid, gid)
	require.Error(t, err)
	require.Contains(t, err.Error(), closed)
}

func TestServerArgsQuoting(t *testing.T) {
	t.Parallel()
	got := serverArgs(5433, "/tmp/x y", Options{Fsync: true, MaxConnections: 50,
		Settings: map[string]string{"search_path": "a, 'b'"}})
	require.Equal(t, `'-p' '5433' '-k' '/tmp/x y' '-c' 'listen_addresses=127.0.0.1' '-c' 'max_connections=50' '-c' 'search_path=a, '\''b'\'''`, got)
}

func TestRootNeedsUsableOSUser(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("only root runs the server as another user")
	}
	if _, err := FindBinaries(); err != nil {
		t.Skipf("no PostgreSQL server binaries: %v", err)
	}
	ctx := t.Context()

	// A name useradd and adduser both reject.
	_, err := Start(ctx, Options{OSUser: "no such user!"})
	require.Error(t, err)
	require.Contains(t, err.Error(), "set HARVEST_PG_OS_USER=name")

	_, err = Start(ctx, Options{OSUser: "root"})
	require.Error(t, err)
	require.Contains(t, err.Error(), "uid 0")

	// t.TempDir's parent is private to root, so the server user cannot
	// reach a cluster created below it.
	_, err = Start(ctx, Options{Dir: t.TempDir()})
	require.Error(t, err)
	require.Contains(t, err.Error(), "cannot reach")
}
