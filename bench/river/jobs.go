package main

import (
	"context"
	"sync/atomic"

	"github.com/riverqueue/river"
)

// Both tenants share one queue. They are told apart by job kind, and the args
// also name the tenant so a row can be read on its own.
const (
	benchQueue = "harvest_bench"
	floodKind  = "harvest_bench_flood"
	lightKind  = "harvest_bench_light"
)

// FloodArgs is one job of the heavy tenant's backlog.
type FloodArgs struct {
	Tenant string `json:"tenant"`
}

func (FloodArgs) Kind() string { return floodKind }

// InsertOpts puts the job on the benchmark's queue; without it River would
// use its "default" queue, which the client does not work.
func (FloodArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{Queue: benchQueue} }

// LightArgs is one job of the light tenant's trickle.
type LightArgs struct {
	Tenant string `json:"tenant"`
	Seq    int    `json:"seq"`
}

func (LightArgs) Kind() string { return lightKind }

func (LightArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{Queue: benchQueue} }

// floodWorker does nothing but count, so the progress line can be printed
// without querying the database. The figures themselves come from river_job.
type floodWorker struct {
	river.WorkerDefaults[FloodArgs]
	worked *atomic.Int64
}

func (w *floodWorker) Work(context.Context, *river.Job[FloodArgs]) error {
	w.worked.Add(1)
	return nil
}

type lightWorker struct {
	river.WorkerDefaults[LightArgs]
}

func (w *lightWorker) Work(context.Context, *river.Job[LightArgs]) error { return nil }
