// Package testsignal lets a test wait for something a background loop did,
// instead of sleeping: the loop signals a value at each step of interest,
// and a test that initialised the signal waits for it. A signal that was
// never initialised (in production) does nothing and costs a nil check.
package testsignal

import (
	"context"
	"fmt"
)

// Signal carries values of type T from a loop to a test.
type Signal[T any] struct{ ch chan T }

// Init makes the signal record values; only tests call it, before the
// loop starts.
func (s *Signal[T]) Init() { s.ch = make(chan T, 256) }

// Signal records v for a waiting test. It never blocks the loop: when the
// test has let 256 values pile up, the oldest is dropped.
func (s *Signal[T]) Signal(v T) {
	if s.ch == nil {
		return
	}
	for {
		select {
		case s.ch <- v:
			return
		default:
			select {
			case <-s.ch:
			default:
			}
		}
	}
}

// WaitFor returns the first value signalled from now on that satisfies ok,
// or ctx's error when it ends first.
func (s *Signal[T]) WaitFor(ctx context.Context, ok func(T) bool) (T, error) {
	var zero T
	if s.ch == nil {
		return zero, fmt.Errorf("testsignal: WaitFor on a signal that was not initialised")
	}
	for {
		select {
		case v := <-s.ch:
			if ok(v) {
				return v, nil
			}
		case <-ctx.Done():
			return zero, ctx.Err()
		}
	}
}
