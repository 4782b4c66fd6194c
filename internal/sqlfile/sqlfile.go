// Package sqlfile reads the SQL statements a package embeds.
//
// Each package that talks to a shard keeps its statements in sql/Name.sql
// files, named by their noun first (TaskClaimFair, WeightSetOne), and embeds
// them with go:embed. Reading them goes through Must, so a missing file
// fails at package initialisation rather than at the first query.
package sqlfile

import (
	"fmt"
	"io/fs"
)

// Must returns the text of sql/<name>.sql in fsys. It panics when the file
// is missing, which can only be a build mistake.
func Must(fsys fs.FS, name string) string {
	b, err := fs.ReadFile(fsys, "sql/"+name+".sql")
	if err != nil {
		panic(fmt.Sprintf("sqlfile: missing embedded query %s: %v", name, err))
	}
	return string(b)
}
