package tenantmove

import (
	"embed"

	"github.com/harvest-run/harvest/internal/sqlfile"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

func mustSQL(name string) string { return sqlfile.Must(sqlFiles, name) }

var (
	sqlMoveLockTry        = mustSQL("MoveLockTry")
	sqlMoveLockRelease    = mustSQL("MoveLockRelease")
	sqlShardAdmissionLock = mustSQL("ShardAdmissionLock")

	sqlTenantRunningLock       = mustSQL("TenantRunningLock")
	sqlTenantRunningRead       = mustSQL("TenantRunningRead")
	sqlTenantRunningAdd        = mustSQL("TenantRunningAdd")
	sqlTenantRunningSet        = mustSQL("TenantRunningSet")
	sqlTenantRunningShardTotal = mustSQL("TenantRunningShardTotal")
	sqlShardLeaseRoom          = mustSQL("ShardLeaseRoom")
	sqlTenantRunningAll        = mustSQL("TenantRunningAll")

	sqlTenantFenceRaise = mustSQL("TenantFenceRaise")
	sqlTenantFenceDrop  = mustSQL("TenantFenceDrop")

	sqlTenantAwaySet   = mustSQL("TenantAwaySet")
	sqlTenantAwayLower = mustSQL("TenantAwayLower")
	sqlTenantAwayDrop  = mustSQL("TenantAwayDrop")

	sqlFairStateDebts     = mustSQL("FairStateDebts")
	sqlFairStateKeyCount  = mustSQL("FairStateKeyCount")
	sqlFairStateCarry     = mustSQL("FairStateCarry")
	sqlFairQueueLock      = mustSQL("FairQueueLock")
	sqlFairQueueEnsure    = mustSQL("FairQueueEnsure")
	sqlWeightOverrideRead = mustSQL("WeightOverrideOfTenant")
	sqlWeightOverrideCopy = mustSQL("WeightOverrideCarry")
	sqlQuotaRead          = mustSQL("QuotaOfTenant")
	sqlQuotaCopy          = mustSQL("QuotaCarry")

	sqlMoveOutOfTenant    = mustSQL("MoveOutOfTenant")
	sqlMoveOutAdd         = mustSQL("MoveOutAdd")
	sqlRunMoveCandidates  = mustSQL("RunMoveCandidates")
	sqlTaskHide           = mustSQL("TaskHide")
	sqlRunLockMany        = mustSQL("RunLockMany")
	sqlTaskLiveOfRuns     = mustSQL("TaskLiveOfRuns")
	sqlTaskMovingOfRuns   = mustSQL("TaskMovingOfRuns")
	sqlRunCopyRead        = mustSQL("RunCopyRead")
	sqlTaskCopyRead       = mustSQL("TaskCopyRead")
	sqlRunHeldIDs         = mustSQL("RunHeldIDs")
	sqlRunCopyInsert      = mustSQL("RunCopyInsert")
	sqlTaskCopyInsert     = mustSQL("TaskCopyInsert")
	sqlRunDropMany        = mustSQL("RunDropMany")
	sqlRunTenantLeft      = mustSQL("RunTenantLeft")
	sqlRunTenantCount     = mustSQL("RunTenantCount")
	sqlDeferredGroupLock  = mustSQL("DeferredGroupLock")
	sqlDeferredGroupRead  = mustSQL("DeferredGroupRead")
	sqlDeferredStartRead  = mustSQL("DeferredStartRead")
	sqlDeferredRunLock    = mustSQL("DeferredRunLock")
	sqlDeferredGroupCarry = mustSQL("DeferredGroupCarry")
	sqlDeferredStartCarry = mustSQL("DeferredStartCarry")
	sqlDeferredGroupDrop  = mustSQL("DeferredGroupDrop")
)
