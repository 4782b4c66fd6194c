package workerbin

import (
	"embed"

	"github.com/harvest-run/harvest/internal/sqlfile"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

var (
	sqlAutovacuumOn    = sqlfile.Must(sqlFiles, "AutovacuumOn")
	sqlConnectionLimit = sqlfile.Must(sqlFiles, "ConnectionLimit")
)
