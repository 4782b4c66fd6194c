package tenantmove

import (
	"embed"

	"github.com/harvest-run/harvest/internal/sqlfile"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

var (
	sqlMoveLockTry        = sqlfile.Must(sqlFiles, "MoveLockTry")
	sqlMoveLockRelease    = sqlfile.Must(sqlFiles, "MoveLockRelease")
	sqlShardAdmissionLock = sqlfile.Must(sqlFiles, "ShardAdmissionLock")

	sqlTenantRunningLock       = sqlfile.Must(sqlFiles, "TenantRunningLock")
	sqlTenantRunningRead       = sqlfile.Must(sqlFiles, "TenantRunningRead")
	sqlTenantRunningAdd        = sqlfile.Must(sqlFiles, "TenantRunningAdd")
	sqlTenantRunningSet        = sqlfile.Must(sqlFiles, "TenantRunningSet")
	sqlTenantRunningShardTotal = sqlfile.Must(sqlFiles, "TenantRunningShardTotal")
	sqlShardLeaseRoom          = sqlfile.Must(sqlFiles, "ShardLeaseRoom")
	sqlTenantRunningAll        = sqlfile.Must(sqlFiles, "TenantRunningAll")

	sqlTenantFenceRaise = sqlfile.Must(sqlFiles, "TenantFenceRaise")
	sqlTenantFenceDrop  = sqlfile.Must(sqlFiles, "TenantFenceDrop")

	sqlTenantAwaySet   = sqlfile.Must(sqlFiles, "TenantAwaySet")
	sqlTenantAwayLower = sqlfile.Must(sqlFiles, "TenantAwayLower")
	sqlTenantAwayDrop  = sqlfile.Must(sqlFiles, "TenantAwayDrop")

	sqlFairStateDebts     = sqlfile.Must(sqlFiles, "FairStateDebts")
	sqlFairStateKeyCount  = sqlfile.Must(sqlFiles, "FairStateKeyCount")
	sqlFairStateCarry     = sqlfile.Must(sqlFiles, "FairStateCarry")
	sqlFairQueueLock      = sqlfile.Must(sqlFiles, "FairQueueLock")
	sqlFairQueueEnsure    = sqlfile.Must(sqlFiles, "FairQueueEnsure")
	sqlWeightOverrideRead = sqlfile.Must(sqlFiles, "WeightOverrideOfTenant")
	sqlWeightOverrideCopy = sqlfile.Must(sqlFiles, "WeightOverrideCarry")
	sqlQuotaRead          = sqlfile.Must(sqlFiles, "QuotaOfTenant")
	sqlQuotaCopy          = sqlfile.Must(sqlFiles, "QuotaCarry")

	sqlMoveOutOfTenant    = sqlfile.Must(sqlFiles, "MoveOutOfTenant")
	sqlMoveOutAdd         = sqlfile.Must(sqlFiles, "MoveOutAdd")
	sqlRunMoveCandidates  = sqlfile.Must(sqlFiles, "RunMoveCandidates")
	sqlTaskHide           = sqlfile.Must(sqlFiles, "TaskHide")
	sqlRunLockMany        = sqlfile.Must(sqlFiles, "RunLockMany")
	sqlTaskLiveOfRuns     = sqlfile.Must(sqlFiles, "TaskLiveOfRuns")
	sqlTaskMovingOfRuns   = sqlfile.Must(sqlFiles, "TaskMovingOfRuns")
	sqlRunCopyRead        = sqlfile.Must(sqlFiles, "RunCopyRead")
	sqlTaskCopyRead       = sqlfile.Must(sqlFiles, "TaskCopyRead")
	sqlRunHeldIDs         = sqlfile.Must(sqlFiles, "RunHeldIDs")
	sqlRunCopyInsert      = sqlfile.Must(sqlFiles, "RunCopyInsert")
	sqlTaskCopyInsert     = sqlfile.Must(sqlFiles, "TaskCopyInsert")
	sqlRunDropMany        = sqlfile.Must(sqlFiles, "RunDropMany")
	sqlRunTenantLeft      = sqlfile.Must(sqlFiles, "RunTenantLeft")
	sqlRunTenantCount     = sqlfile.Must(sqlFiles, "RunTenantCount")
	sqlDeferredGroupLock  = sqlfile.Must(sqlFiles, "DeferredGroupLock")
	sqlDeferredGroupRead  = sqlfile.Must(sqlFiles, "DeferredGroupRead")
	sqlDeferredStartRead  = sqlfile.Must(sqlFiles, "DeferredStartRead")
	sqlDeferredRunLock    = sqlfile.Must(sqlFiles, "DeferredRunLock")
	sqlDeferredGroupCarry = sqlfile.Must(sqlFiles, "DeferredGroupCarry")
	sqlDeferredStartCarry = sqlfile.Must(sqlFiles, "DeferredStartCarry")
	sqlDeferredGroupDrop  = sqlfile.Must(sqlFiles, "DeferredGroupDrop")
)
