package runstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/claim"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

func mustSQL(name string) string {
	b, err := sqlFiles.ReadFile("sql/" + name + ".sql")
	if err != nil {
		panic(fmt.Sprintf("runstore: missing embedded query %s: %v", name, err))
	}
	return string(b)
}

var (
	sqlRunInsert        = mustSQL("RunInsert")
	sqlRunGet           = mustSQL("RunGet")
	sqlTenantRunningAdd = mustSQL("TenantRunningAdd")
)

// ErrConflict means a run with the same id exists but was started with a
// different request.
var ErrConflict = errors.New("runstore: a run with this id exists with a different request")

// ErrNotFound means the tenant has no run with that id.
var ErrNotFound = errors.New("runstore: run not found")

// Beginner opens transactions: a *pgxpool.Pool or a *pgx.Conn.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// StartParams is one validated start, bound to its tenant and shard.
type StartParams struct {
	Tenant string
	Shard  int
	// Req must have passed Validate and carry its final id.
	Req api.StartRequest
	// TraceContext is the start span's W3C context, stored with the task so
	// the claim and execution spans link back to it.
	TraceContext json.RawMessage
}

// StartResult is what a start did.
type StartResult struct {
	Run api.Run
	// Created is true for a new run (HTTP 201), false for a replay (200).
	Created bool
	// TaskID is the first task's id; zero on a replay.
	TaskID int64
}

// Start writes a new run with its first task and counts it for its tenant,
// all in one transaction. A replay of the same request returns the
// existing run with Created false; the same id with a different request
// returns ErrConflict. Nothing is written unless everything is.
func Start(ctx context.Context, db Beginner, p StartParams) (StartResult, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return StartResult{}, fmt.Errorf("runstore: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after commit
	res, err := StartTx(ctx, tx, p)
	if err != nil {
		return StartResult{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return StartResult{}, fmt.Errorf("runstore: commit start: %w", err)
	}
	return res, nil
}

// StartTx is Start inside a transaction the caller owns, so several starts
// can share one commit. On error the caller must roll back (or roll back to
// a savepoint), since part of the start may have been written.
func StartTx(ctx context.Context, tx pgx.Tx, p StartParams) (StartResult, error) {
	r := &p.Req
	if r.ID == "" {
		return StartResult{}, errors.New("runstore: start without a run id")
	}
	hash, err := RequestHash(r)
	if err != nil {
		return StartResult{}, err
	}
	var qk string
	if r.QuotaKey != nil {
		qk = *r.QuotaKey
	}
	key := r.Key()
	maxAttempts := api.DefaultMaxAttempts
	if r.MaxAttempts != nil {
		maxAttempts = *r.MaxAttempts
	}
	var timeoutMS *int64
	if r.Timeout != nil {
		ms := max(time.Duration(*r.Timeout).Milliseconds(), 1)
		timeoutMS = &ms
	}
	var input any
	if len(r.Input) > 0 {
		input = string(r.Input)
	}

	var pk int64
	err = tx.QueryRow(ctx, sqlRunInsert, p.Tenant, r.ID, r.Name, r.Queue, key, qk, r.Priority,
		input, hash, maxAttempts, timeoutMS).Scan(&pk)
	if errors.Is(err, pgx.ErrNoRows) {
		existing, stored, gerr := get(ctx, tx, p.Tenant, r.ID, p.Shard)
		if gerr != nil {
			return StartResult{}, gerr
		}
		if !bytes.Equal(stored, hash) {
			return StartResult{Run: existing}, ErrConflict
		}
		return StartResult{Run: existing}, nil
	}
	if err != nil {
		return StartResult{}, fmt.Errorf("runstore: insert run: %w", err)
	}
	due, err := dueAt(ctx, tx, r)
	if err != nil {
		return StartResult{}, err
	}
	taskID, err := claim.Enqueue(ctx, tx, claim.NewTask{
		RunPK:        pk,
		Queue:        r.Queue,
		Key:          key,
		QuotaKey:     qk,
		Priority:     r.Priority,
		DueAt:        due,
		Input:        r.Input,
		TraceContext: p.TraceContext,
	})
	if err != nil {
		return StartResult{}, fmt.Errorf("runstore: enqueue first task: %w", err)
	}
	if _, err := tx.Exec(ctx, sqlTenantRunningAdd, p.Tenant, 1); err != nil {
		return StartResult{}, fmt.Errorf("runstore: count running: %w", err)
	}
	run, _, err := get(ctx, tx, p.Tenant, r.ID, p.Shard)
	if err != nil {
		return StartResult{}, err
	}
	return StartResult{Run: run, Created: true, TaskID: taskID}, nil
}

// dueAt resolves run_at or delay to an absolute time on the database clock;
// zero means due at once.
func dueAt(ctx context.Context, tx pgx.Tx, r *api.StartRequest) (time.Time, error) {
	switch {
	case r.RunAt != nil:
		return r.RunAt.Time, nil
	case r.Delay != nil && *r.Delay > 0:
		var t time.Time
		if err := tx.QueryRow(ctx, `SELECT now() + $1::interval`, time.Duration(*r.Delay)).Scan(&t); err != nil {
			return time.Time{}, fmt.Errorf("runstore: compute due time: %w", err)
		}
		return t, nil
	}
	return time.Time{}, nil
}

// Get reads the tenant's run; ErrNotFound when the tenant has none by that
// id (another tenant's run is not found either).
func Get(ctx context.Context, db claim.DB, tenant, id string, shard int) (api.Run, error) {
	run, _, err := get(ctx, db, tenant, id, shard)
	return run, err
}

func get(ctx context.Context, db claim.DB, tenant, id string, shard int) (api.Run, []byte, error) {
	var (
		run               api.Run
		pk                int64
		status            string
		created           time.Time
		claimed, finished *time.Time
		output            []byte
		errText           *string
		hash              []byte
	)
	err := db.QueryRow(ctx, sqlRunGet, tenant, id).Scan(&pk, &run.ID, &run.Tenant, &run.Name, &run.Queue,
		&run.FairnessKey, &run.QuotaKey, &run.Priority, &status, &run.Attempts,
		&created, &claimed, &finished, &output, &errText, &hash)
	if errors.Is(err, pgx.ErrNoRows) {
		return api.Run{}, nil, ErrNotFound
	}
	if err != nil {
		return api.Run{}, nil, fmt.Errorf("runstore: read run: %w", err)
	}
	run.Shard = shard
	run.Status = api.Status(status)
	run.CreatedAt = api.Time{Time: created}
	if claimed != nil {
		run.ClaimedAt = &api.Time{Time: *claimed}
	}
	if finished != nil {
		run.FinishedAt = &api.Time{Time: *finished}
	}
	if len(output) > 0 {
		run.Output = json.RawMessage(output)
	}
	run.Error = errText
	return run, hash, nil
}

// RequestHash identifies a start request apart from its id: two requests
// with the same hash are the same start. The input is compared as JSON
// values, so white space and key order do not matter.
func RequestHash(r *api.StartRequest) ([]byte, error) {
	c := *r
	c.ID = ""
	if len(c.Input) > 0 {
		canon, err := canonicalJSON(c.Input)
		if err != nil {
			return nil, fmt.Errorf("runstore: input: %w", err)
		}
		c.Input = canon
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("runstore: hash request: %w", err)
	}
	sum := sha256.Sum256(b)
	return sum[:], nil
}

// canonicalJSON re-encodes a JSON value with sorted object keys and exact
// numbers.
func canonicalJSON(raw json.RawMessage) (json.RawMessage, error) {
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}
