package workerbin

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/harvest-run/harvest/pkg/worker"
)

// RegisterDemo registers the demo workflows used by the README, the tests
// and the benchmarks:
//
//	echo   completes with its input.
//	sleep  {"ms":N}: waits N milliseconds (or until cancelled), completes with {"slept_ms":N}.
//	fail   {"times":N}: fails its first N attempts, then completes with {"attempts":A}.
//	steps  {"n":N,"ms":M}: runs N steps of M milliseconds each, continuing the run
//	       from one step to the next, then completes with {"steps":N}.
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
