// Package sqlfile is the one loader of the SQL statements a package embeds.
//
// Each package that talks to a shard keeps its statements in sql/Name.sql
// files, named by their noun first (TaskClaimFair, WeightSetOne), embeds
// them and reads each one into a package variable with Must, called
// directly; no package wraps it in a helper of its own:
//
//	//go:embed sql/*.sql
//	var sqlFiles embed.FS
//
//	var sqlRunGet = sqlfile.Must(sqlFiles, "RunGet")
//
// Must runs while the package's variables are initialised, so a statement
// whose file is missing (a renamed file, a typo in the name) stops the
// program, and every test of the package, before the first query rather
// than when that query is first sent.
package sqlfile
