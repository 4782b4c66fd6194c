package tenantcap

import (
	"embed"

	"github.com/harvest-run/harvest/internal/sqlfile"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

var (
	sqlAdmitLock          = sqlfile.Must(sqlFiles, "AdmitLock")
	sqlAdmitRead          = sqlfile.Must(sqlFiles, "AdmitRead")
	sqlShardTotal         = sqlfile.Must(sqlFiles, "ShardTotal")
	sqlRunningByTenant    = sqlfile.Must(sqlFiles, "RunningByTenant")
	sqlRecountDrift       = sqlfile.Must(sqlFiles, "RecountDrift")
	sqlRecountLock        = sqlfile.Must(sqlFiles, "RecountLock")
	sqlRecountFix         = sqlfile.Must(sqlFiles, "RecountFix")
	sqlRecountInsert      = sqlfile.Must(sqlFiles, "RecountInsert")
	sqlRecountTotalLock   = sqlfile.Must(sqlFiles, "RecountTotalLock")
	sqlRecountStripesLock = sqlfile.Must(sqlFiles, "RecountStripesLock")
	sqlRecountTotalFix    = sqlfile.Must(sqlFiles, "RecountTotalFix")
	sqlSettingsGet        = sqlfile.Must(sqlFiles, "SettingsGet")
	sqlSettingsEnsure     = sqlfile.Must(sqlFiles, "SettingsEnsure")
	sqlSettingsLock       = sqlfile.Must(sqlFiles, "SettingsLock")
	sqlSettingsPut        = sqlfile.Must(sqlFiles, "SettingsPut")
	sqlAuditInsert        = sqlfile.Must(sqlFiles, "AuditInsert")
	sqlLedgerEnsure       = sqlfile.Must(sqlFiles, "LedgerEnsure")
	sqlLedgerLock         = sqlfile.Must(sqlFiles, "LedgerLock")
	sqlLedgerRead         = sqlfile.Must(sqlFiles, "LedgerRead")
	sqlLedgerGrant        = sqlfile.Must(sqlFiles, "LedgerGrant")
	sqlLedgerTakeReturn   = sqlfile.Must(sqlFiles, "LedgerTakeReturn")
	sqlLeaseTakeGrant     = sqlfile.Must(sqlFiles, "LeaseTakeGrant")
	sqlLeaseRead          = sqlfile.Must(sqlFiles, "LeaseRead")
	sqlLeaseGiveBack      = sqlfile.Must(sqlFiles, "LeaseGiveBack")
	sqlLeaseTryLock       = sqlfile.Must(sqlFiles, "LeaseTryLock")
	sqlPriorityList       = sqlfile.Must(sqlFiles, "PriorityList")
	sqlPriorityLock       = sqlfile.Must(sqlFiles, "PriorityLock")
	sqlPrioritySet        = sqlfile.Must(sqlFiles, "PrioritySet")
	sqlPriorityClear      = sqlfile.Must(sqlFiles, "PriorityClear")
)
