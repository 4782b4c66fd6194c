package workerbin

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/harvest-run/harvest/pkg/worker"
)

// DemoWorkflows are the names RegisterDemo registers.
var DemoWorkflows = []string{"echo", "sleep", "fail", "steps"}

// Bounds of the demo workflows. Whoever can start a run can start a demo
// one where they are registered (harvest dev, a worker with
// HARVEST_WORKER_DEMO_HANDLERS=true), so no input may hold a task slot, or
// chain tasks, for longer than a demo needs.
const (
	// DemoMaxMS is the longest a sleep waits, and the longest all the steps
	// of a steps run wait together, in milliseconds: ten minutes.
	DemoMaxMS = 10 * 60 * 1000
	// DemoMaxSteps is the most steps a steps run takes.
	DemoMaxSteps = 1000
)

// RegisterDemo registers the demo workflows used by the README, the tests
// and the benchmarks:
//
//	echo   completes with its input.
//	sleep  {"ms":N}: waits N milliseconds (or until cancelled), completes with {"slept_ms":N}.
//	fail   {"times":N}: fails its first N attempts, then completes with {"attempts":A}.
//	steps  {"n":N,"ms":M}: runs N steps of M milliseconds each, continuing the run
//	       from one step to the next, then completes with {"steps":N}.
//
// An input past the bounds (ms from 0 to DemoMaxMS, n from 0 to
// DemoMaxSteps, n×ms at most DemoMaxMS) fails the run at once, naming the
// field.
func RegisterDemo(w *worker.Worker) {
	w.HandleFunc("echo", echo)
	w.HandleFunc("sleep", sleepTask)
	w.HandleFunc("fail", failTask)
	w.HandleFunc("steps", stepsTask)
}

func decode(t worker.Task, v any) error {
	if len(t.Input) == 0 || string(t.Input) == "null" {
		return nil
	}
	if err := json.Unmarshal(t.Input, v); err != nil {
		return worker.Permanent(fmt.Errorf("%s: bad input: %w", t.Workflow, err))
	}
	return nil
}

// outOfRange is the error of an input field past its bounds: permanent,
// since another attempt would get the same input.
func outOfRange(workflow, field string, v, hi int64, what string) error {
	return worker.Permanent(fmt.Errorf("%s: %s %d is out of range: from 0 to %d (%s)", workflow, field, v, hi, what))
}

func echo(_ context.Context, t worker.Task) (worker.Result, error) {
	return worker.Complete(t.Input), nil
}

// wait sleeps for d unless ctx ends first.
func wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-timer.C:
		return nil
	}
}

func sleepTask(ctx context.Context, t worker.Task) (worker.Result, error) {
	var in struct {
		MS int64 `json:"ms"`
	}
	if err := decode(t, &in); err != nil {
		return worker.Result{}, err
	}
	if in.MS < 0 || in.MS > DemoMaxMS {
		return worker.Result{}, outOfRange(t.Workflow, "ms", in.MS, DemoMaxMS, "ten minutes")
	}
	if err := wait(ctx, time.Duration(in.MS)*time.Millisecond); err != nil {
		return worker.Result{}, err
	}
	return worker.Complete(fmt.Appendf(nil, `{"slept_ms":%d}`, in.MS)), nil
}

func failTask(_ context.Context, t worker.Task) (worker.Result, error) {
	var in struct {
		Times int `json:"times"`
	}
	if err := decode(t, &in); err != nil {
		return worker.Result{}, err
	}
	if t.Attempt <= in.Times {
		return worker.Result{}, fmt.Errorf("fail: attempt %d of the %d asked to fail", t.Attempt, in.Times)
	}
	return worker.Complete(fmt.Appendf(nil, `{"attempts":%d}`, t.Attempt)), nil
}

func stepsTask(ctx context.Context, t worker.Task) (worker.Result, error) {
	var in struct {
		N  int   `json:"n"`
		MS int64 `json:"ms"`
	}
	if err := decode(t, &in); err != nil {
		return worker.Result{}, err
	}
	switch {
	case in.N < 0 || in.N > DemoMaxSteps:
		return worker.Result{}, outOfRange(t.Workflow, "n", int64(in.N), DemoMaxSteps, "steps")
	case in.MS < 0 || in.MS > DemoMaxMS:
		return worker.Result{}, outOfRange(t.Workflow, "ms", in.MS, DemoMaxMS, "ten minutes")
	case in.MS*int64(in.N) > DemoMaxMS:
		return worker.Result{}, worker.Permanent(fmt.Errorf("%s: n %d steps of ms %d wait %d ms in all: at most %d (ten minutes)",
			t.Workflow, in.N, in.MS, in.MS*int64(in.N), DemoMaxMS))
	}
	if t.Step >= in.N {
		return worker.Complete(fmt.Appendf(nil, `{"steps":%d}`, in.N)), nil
	}
	if err := wait(ctx, time.Duration(in.MS)*time.Millisecond); err != nil {
		return worker.Result{}, err
	}
	if t.Step+1 >= in.N {
		return worker.Complete(fmt.Appendf(nil, `{"steps":%d}`, in.N)), nil
	}
	return worker.Continue(t.Input), nil
}
