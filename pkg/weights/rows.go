package weights

import "time"

// The rows of this package's statements, read by column name
// (internal/pgrow); each function turns them into pkg/api's types.

// overrideRow is a row of WeightList.
type overrideRow struct {
	Key       string    `db:"key"`
	Weight    float64   `db:"weight"`
	UpdatedAt time.Time `db:"updated_at"`
	UpdatedBy string    `db:"updated_by"`
}

// quotaChangeRow is the row of QuotaSetOne and QuotaClearOne: the
// outcome and the quota before the write as JSON (NULL: there was none).
type quotaChangeRow struct {
	Outcome string `db:"outcome"`
	Old     []byte `db:"old_value"`
}

// quotaRow is a row of QuotaList.
type quotaRow struct {
	QuotaKey      string    `db:"quota_key"`
	MaxConcurrent *int      `db:"max_concurrent"`
	Rate          *float64  `db:"rate"`
	Burst         *float64  `db:"burst"`
	UpdatedAt     time.Time `db:"updated_at"`
	UpdatedBy     string    `db:"updated_by"`
}

// keyRow is a row of KeyList; Weight is nil without an override.
type keyRow struct {
	Key       string     `db:"key"`
	Weight    *float64   `db:"weight"`
	Pass      *float64   `db:"pass"`
	ChargedAt *time.Time `db:"charged_at"`
	Lag       float64    `db:"lag"`
	Pending   int        `db:"pending"`
	Claims    int        `db:"claims"`
	Clock     float64    `db:"clock"`
}

// auditRow is a row of AuditList.
type auditRow struct {
	ID       int64      `db:"id"`
	At       time.Time  `db:"at"`
	Actor    string     `db:"actor"`
	Action   string     `db:"action"`
	Queue    *string    `db:"queue"`
	Key      *string    `db:"key"`
	OldValue []byte     `db:"old_value"`
	NewValue []byte     `db:"new_value"`
	Outcome  string     `db:"outcome"`
	Message  string     `db:"message"`
	Repeats  int        `db:"repeats"`
	LastAt   *time.Time `db:"last_at"`
}

// fairnessRow is the row of QueueFairnessGet.
type fairnessRow struct {
	TwoLevel  bool      `db:"two_level"`
	Charge    string    `db:"charge"`
	UpdatedAt time.Time `db:"updated_at"`
	UpdatedBy string    `db:"updated_by"`
}

// pauseRow is the row of QueuePauseGet.
type pauseRow struct {
	At time.Time `db:"paused_at"`
	By string    `db:"paused_by"`
}

// pauseSetRow is the row of QueuePauseSetOne: whether the write changed
// the queue, and its pause after it (NULLs: it runs).
type pauseSetRow struct {
	Changed bool       `db:"changed"`
	At      *time.Time `db:"paused_at"`
	By      *string    `db:"paused_by"`
}
