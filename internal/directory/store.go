package directory

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/sqlfile"
	"github.com/harvest-run/harvest/pkg/shard"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

var (
	sqlTenantHomeGet     = sqlfile.Must(sqlFiles, "TenantHomeGet")
	sqlTenantHomePlace   = sqlfile.Must(sqlFiles, "TenantHomePlace")
	sqlTenantHomeInsert  = sqlfile.Must(sqlFiles, "TenantHomeInsert")
	sqlTenantHomeList    = sqlfile.Must(sqlFiles, "TenantHomeList")
	sqlTenantHomeChanged = sqlfile.Must(sqlFiles, "TenantHomeChanged")
	sqlTenantHomeNow     = sqlfile.Must(sqlFiles, "TenantHomeNow")
	sqlTenantHomeUpdate  = sqlfile.Must(sqlFiles, "TenantHomeUpdate")
)

// Phase is where a tenant's entry stands in a move.
type Phase string

// The phases of an entry (see tenant_homes in migration 0004).
const (
	// PhaseHome: nothing in progress; Shard is the home.
	PhaseHome Phase = "home"
	// PhaseFencing: a move to MoveTo was asked for; Shard is still the
	// home and takes starts until its fence is up.
	PhaseFencing Phase = "fencing"
	// PhaseCopying: Shard is the new home and takes starts; the runs on
	// MovingFrom are being copied to it.
	PhaseCopying Phase = "copying"
)

// How a tenant got its home (Entry.PlacedBy).
const (
	PlacedByHash = "hash"
	PlacedByPin  = "pin"
	PlacedByMove = "move"
)

// ErrNoEntry means the tenant has no entry yet.
var ErrNoEntry = errors.New("directory: the tenant has no recorded home")

// ErrStale means the entry changed since it was read: read it again.
var ErrStale = errors.New("directory: the entry changed since it was read")

// Entry is one tenant's row of tenant_homes.
type Entry struct {
	Tenant string `db:"tenant" json:"tenant"`
	// Shard is the home: where the tenant's new runs are written.
	Shard int   `db:"shard" json:"shard"`
	Phase Phase `db:"phase" json:"phase"`
	// MoveTo is the target of a move in PhaseFencing.
	MoveTo *int `db:"move_to" json:"move_to,omitempty"`
	// MovingFrom is the old home during PhaseCopying: runs not copied yet
	// are still there.
	MovingFrom *int      `db:"moving_from" json:"moving_from,omitempty"`
	PlacedBy   string    `db:"placed_by" json:"placed_by"`
	Version    int64     `db:"version" json:"version"`
	UpdatedAt  time.Time `db:"updated_at" json:"updated_at"`
}

// From returns the old home of a move in PhaseCopying, or -1.
func (e Entry) From() int {
	if e.MovingFrom == nil {
		return -1
	}
	return *e.MovingFrom
}

// Target returns the shard a move in PhaseFencing goes to, or -1.
func (e Entry) Target() int {
	if e.MoveTo == nil {
		return -1
	}
	return *e.MoveTo
}

func collectOne(rows pgx.Rows, err error) (Entry, error) {
	if err != nil {
		return Entry{}, err
	}
	return pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[Entry])
}

// Get reads the tenant's entry from shard 0 (ErrNoEntry: none).
func Get(ctx context.Context, shard0 shard.Querier, tenant string) (Entry, error) {
	rows, err := shard0.Query(ctx, sqlTenantHomeGet, tenant)
	e, err := collectOne(rows, err)
	if errors.Is(err, pgx.ErrNoRows) {
		return Entry{}, ErrNoEntry
	}
	if err != nil {
		return Entry{}, fmt.Errorf("directory: read %s: %w", tenant, err)
	}
	return e, nil
}

// Place returns the tenant's entry, recording one first when it has none:
// the rendezvous choice among shards (shards.Home).
func Place(ctx context.Context, shard0 shard.Querier, tenant string, home int) (Entry, error) {
	rows, err := shard0.Query(ctx, sqlTenantHomePlace, tenant, home)
	e, err := collectOne(rows, err)
	if err == nil {
		return e, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Entry{}, fmt.Errorf("directory: place %s: %w", tenant, err)
	}
	// Someone else recorded it first.
	return Get(ctx, shard0, tenant)
}

// Insert records a home chosen by an operator (by: PlacedByPin or
// PlacedByMove) for a tenant without an entry; ok is false when it has one.
func Insert(ctx context.Context, shard0 shard.Querier, tenant string, home int, by string) (e Entry, ok bool, err error) {
	rows, err := shard0.Query(ctx, sqlTenantHomeInsert, tenant, home, by)
	e, err = collectOne(rows, err)
	if errors.Is(err, pgx.ErrNoRows) {
		return Entry{}, false, nil
	}
	if err != nil {
		return Entry{}, false, fmt.Errorf("directory: record %s: %w", tenant, err)
	}
	return e, true, nil
}

// Update writes e's home, phase, move fields and PlacedBy if the entry is
// still at e.Version, and returns the entry as written (its version one
// more). ErrStale: someone changed it in between.
func Update(ctx context.Context, shard0 shard.Querier, e Entry) (Entry, error) {
	rows, err := shard0.Query(ctx, sqlTenantHomeUpdate, e.Tenant, e.Shard, string(e.Phase), e.MoveTo, e.MovingFrom,
		e.PlacedBy, e.Version)
	out, err := collectOne(rows, err)
	if errors.Is(err, pgx.ErrNoRows) {
		return Entry{}, ErrStale
	}
	if err != nil {
		return Entry{}, fmt.Errorf("directory: update %s: %w", e.Tenant, err)
	}
	return out, nil
}

// List reads every entry, in tenant order.
func List(ctx context.Context, shard0 shard.Querier) ([]Entry, error) {
	rows, err := shard0.Query(ctx, sqlTenantHomeList)
	if err != nil {
		return nil, fmt.Errorf("directory: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByName[Entry])
	if err != nil {
		return nil, fmt.Errorf("directory: list: %w", err)
	}
	return out, nil
}

// changedRow is a row of TenantHomeChanged.
type changedRow struct {
	Entry
	ReadAt time.Time `db:"read_at"`
}

// changedSince reads the entries changed since since (shard 0's clock)
// and the clock at the read.
func changedSince(ctx context.Context, shard0 shard.Querier, since time.Time) ([]Entry, time.Time, error) {
	rows, err := shard0.Query(ctx, sqlTenantHomeChanged, since)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("directory: read changes: %w", err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByName[changedRow])
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("directory: read changes: %w", err)
	}
	if len(got) == 0 {
		var now time.Time
		if err := shard0.QueryRow(ctx, sqlTenantHomeNow).Scan(&now); err != nil {
			return nil, time.Time{}, fmt.Errorf("directory: read the clock: %w", err)
		}
		return nil, now, nil
	}
	out := make([]Entry, len(got))
	for i, r := range got {
		out[i] = r.Entry
	}
	return out, got[0].ReadAt, nil
}
