package tenantcap

import (
	"embed"

	"github.com/harvest-run/harvest/internal/sqlfile"
	"github.com/harvest-run/harvest/pkg/shard"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

func mustSQL(name string) string { return sqlfile.Must(sqlFiles, name) }

var (
	sqlAdmitLock          = mustSQL("AdmitLock")
	sqlAdmitRead          = mustSQL("AdmitRead")
	sqlShardTotal         = mustSQL("ShardTotal")
	sqlRunningByTenant    = mustSQL("RunningByTenant")
	sqlRecountDrift       = mustSQL("RecountDrift")
	sqlRecountLock        = mustSQL("RecountLock")
	sqlRecountFix         = mustSQL("RecountFix")
	sqlRecountInsert      = mustSQL("RecountInsert")
	sqlRecountTotalLock   = mustSQL("RecountTotalLock")
	sqlRecountStripesLock = mustSQL("RecountStripesLock")
	sqlRecountTotalFix    = mustSQL("RecountTotalFix")
	sqlSettingsGet        = mustSQL("SettingsGet")
	sqlSettingsEnsure     = mustSQL("SettingsEnsure")
	sqlSettingsLock       = mustSQL("SettingsLock")
	sqlSettingsPut        = mustSQL("SettingsPut")
	sqlAuditInsert        = mustSQL("AuditInsert")
	sqlLedgerEnsure       = mustSQL("LedgerEnsure")
	sqlLedgerLock         = mustSQL("LedgerLock")
	sqlLedgerRead         = mustSQL("LedgerRead")
	sqlLedgerGrant        = mustSQL("LedgerGrant")
	sqlLedgerTakeReturn   = mustSQL("LedgerTakeReturn")
	sqlLeaseTakeGrant     = mustSQL("LeaseTakeGrant")
	sqlLeaseRead          = mustSQL("LeaseRead")
	sqlLeaseGiveBack      = mustSQL("LeaseGiveBack")
	sqlLeaseTryLock       = mustSQL("LeaseTryLock")
	sqlPriorityList       = mustSQL("PriorityList")
	sqlPriorityLock       = mustSQL("PriorityLock")
	sqlPrioritySet        = mustSQL("PrioritySet")
	sqlPriorityClear      = mustSQL("PriorityClear")
)

// DB is what reads need of a shard: a *pgxpool.Pool, a *pgx.Conn or a
// pgx.Tx all qualify.
type DB = shard.Querier

// Beginner is a DB that can open transactions (a pool or a connection).
type Beginner = shard.Beginner
