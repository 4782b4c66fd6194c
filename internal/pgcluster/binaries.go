package pgcluster

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// searchRoots are the directories whose <root>/<version>/bin subdirectories
// FindBinaries tries after PATH. Debian and Ubuntu install the server there.
var searchRoots = []string{"/usr/lib/postgresql"}

// requiredBinaries must all sit in one directory for that directory to count.
// The server binary is included because initdb and pg_ctl run it from their
// own directory.
var requiredBinaries = []string{"initdb", "pg_ctl", "postgres"}

// ErrBinariesNotFound is returned (wrapped in a message that explains how to
// install them) when no directory holds the PostgreSQL server binaries.
var ErrBinariesNotFound = errors.New("PostgreSQL server binaries not found")

// notFoundError carries the user-facing explanation and matches
// ErrBinariesNotFound with errors.Is.
type notFoundError struct{}

func (notFoundError) Error() string {
	return "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or under /usr/lib/postgresql/*/bin: " +
		"install them with `apt-get install postgresql` (Debian/Ubuntu), " +
		"or run the fleet with deploy/compose.yaml, " +
		"or point HARVEST_TEST_DATABASE_URL / HARVEST_DATABASE_URL at a running server"
}

func (notFoundError) Is(target error) bool { return target == ErrBinariesNotFound }

// FindBinaries returns the directory that holds initdb, pg_ctl and postgres.
// It tries the directories on PATH first (following a symlink such as
// /usr/local/bin/initdb to the directory it points into), then
// /usr/lib/postgresql/<version>/bin, newest version first. When nothing is
// found the error explains how to get the binaries and matches
// ErrBinariesNotFound.
func FindBinaries() (dir string, err error) {
	return findBinaries(os.Getenv("PATH"), searchRoots)
}

// findBinaries is FindBinaries with its inputs explicit, so tests can run it
// against a fake PATH and fake install roots without touching the process
// environment.
func findBinaries(pathEnv string, roots []string) (string, error) {
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			continue
		}
		initdb := filepath.Join(d, "initdb")
		if !isExecutable(initdb) {
			continue
		}
		// A symlink on PATH usually points into the real install directory,
		// which is where postgres lives; prefer that directory.
		if real, err := filepath.EvalSymlinks(initdb); err == nil {
			if rd := filepath.Dir(real); hasAll(rd) {
				return rd, nil
			}
		}
		if hasAll(d) {
			return d, nil
		}
	}
	for _, root := range roots {
		entries, err := os.ReadDir(root)
		if err != nil {
			continue
		}
		var versions []string
		for _, e := range entries {
			versions = append(versions, e.Name())
		}
		slices.SortFunc(versions, func(a, b string) int { return compareVersions(b, a) })
		for _, v := range versions {
			if d := filepath.Join(root, v, "bin"); hasAll(d) {
				return d, nil
			}
		}
	}
	return "", notFoundError{}
}

// hasAll reports whether dir holds every required binary.
func hasAll(dir string) bool {
	for _, name := range requiredBinaries {
		if !isExecutable(filepath.Join(dir, name)) {
			return false
		}
	}
	return true
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// compareVersions orders dotted version strings numerically ("9.6" < "15"),
// putting names that are not versions before all versions.
func compareVersions(a, b string) int {
	pa, oka := parseVersion(a)
	pb, okb := parseVersion(b)
	switch {
	case !oka && !okb:
		return strings.Compare(a, b)
	case !oka:
		return -1
	case !okb:
		return 1
	}
	return slices.Compare(pa, pb)
}

func parseVersion(s string) ([]int, bool) {
	var out []int
	for part := range strings.SplitSeq(s, ".") {
		n, err := strconv.Atoi(part)
		if err != nil || n < 0 {
			return nil, false
		}
		out = append(out, n)
	}
	return out, true
}
