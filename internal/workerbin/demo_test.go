package workerbin

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/worker"
)

func TestDemoHandlers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	task := func(name, input string, attempt, step int) worker.Task {
		return worker.Task{Workflow: name, Input: json.RawMessage(input), Attempt: attempt, Step: step}
	}

	res, err := echo(ctx, task("echo", `{"a":1}`, 1, 0))
	require.NoError(t, err)
	require.JSONEq(t, `{"a":1}`, string(res.Output))

	res, err = sleepTask(ctx, task("sleep", `{"ms":1}`, 1, 0))
	require.NoError(t, err)
	require.JSONEq(t, `{"slept_ms":1}`, string(res.Output))
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = sleepTask(cancelled, task("sleep", `{"ms":60000}`, 1, 0))
	require.ErrorIs(t, err, context.Canceled)

	_, err = failTask(ctx, task("fail", `{"times":2}`, 2, 0))
	require.Error(t, err)
	require.False(t, worker.IsPermanent(err))
	res, err = failTask(ctx, task("fail", `{"times":2}`, 3, 0))
	require.NoError(t, err)
	require.JSONEq(t, `{"attempts":3}`, string(res.Output))

	res, err = stepsTask(ctx, task("steps", `{"n":3}`, 1, 1))
	require.NoError(t, err)
	require.NotNil(t, res.Next)
	res, err = stepsTask(ctx, task("steps", `{"n":3}`, 1, 2))
	require.NoError(t, err)
	require.Nil(t, res.Next)
	require.JSONEq(t, `{"steps":3}`, string(res.Output))

	_, err = sleepTask(ctx, task("sleep", `[1]`, 1, 0))
	require.True(t, worker.IsPermanent(err), "bad input is not retried")
}

// The demo workflows refuse inputs that would hold a task slot, or chain
// tasks, for longer than a demo needs: at once, for good, naming the field.
func TestDemoHandlersAreBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	task := func(name, input string) worker.Task {
		return worker.Task{Workflow: name, Input: json.RawMessage(input), Attempt: 1}
	}
	cases := []struct {
		name, input, field string
		run                func(context.Context, worker.Task) (worker.Result, error)
	}{
		{"sleep", `{"ms":9000000000000000}`, "ms", sleepTask},
		{"sleep", `{"ms":600001}`, "ms", sleepTask},
		{"sleep", `{"ms":-1}`, "ms", sleepTask},
		{"steps", `{"n":2147483647}`, "n", stepsTask},
		{"steps", `{"n":1001}`, "n", stepsTask},
		{"steps", `{"n":-1}`, "n", stepsTask},
		{"steps", `{"n":2,"ms":600001}`, "ms", stepsTask},
		{"steps", `{"n":1000,"ms":601}`, "in all", stepsTask},
	}
	for _, c := range cases {
		_, err := c.run(ctx, task(c.name, c.input))
		require.Error(t, err, "%s %s", c.name, c.input)
		require.True(t, worker.IsPermanent(err), "%s %s: not retried", c.name, c.input)
		require.ErrorContains(t, err, c.field, "%s %s", c.name, c.input)
	}
	// The bounds themselves are allowed (a cancelled context ends the wait).
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err := sleepTask(cancelled, task("sleep", `{"ms":600000}`))
	require.ErrorIs(t, err, context.Canceled)
	res, err := stepsTask(ctx, task("steps", `{"n":1000}`))
	require.NoError(t, err)
	require.NotNil(t, res.Next)
	_, err = stepsTask(cancelled, task("steps", `{"n":1000,"ms":600}`))
	require.ErrorIs(t, err, context.Canceled)
}
