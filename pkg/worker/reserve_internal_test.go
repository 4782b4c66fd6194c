package worker

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// slotsHeld makes a slot channel of n slots with held of them taken: the
// claim loop's own slot and held-1 tasks still running.
func slotsHeld(n, held int) chan struct{} {
	slots := make(chan struct{}, n)
	for range held {
		slots <- struct{}{}
	}
	return slots
}

// Without a wait the loop takes only the slots free at once.
func TestReserveSlotsTakesWhatIsFree(t *testing.T) {
	t.Parallel()
	slots := slotsHeld(10, 5)
	require.Equal(t, 6, reserveSlots(context.Background(), slots, 10, 0, nil))
	require.Len(t, slots, 10)

	// The batch size caps it.
	slots = slotsHeld(10, 1)
	require.Equal(t, 4, reserveSlots(context.Background(), slots, 4, 0, nil))
	require.Len(t, slots, 4)
}

// After a full claim the loop holds out for a whole batch: tasks that
// finish while it waits give their slots to the next claim.
func TestReserveSlotsWaitsForAWholeBatch(t *testing.T) {
	t.Parallel()
	slots := slotsHeld(10, 5)
	freed := make(chan struct{})
	go func() {
		defer close(freed)
		// Four running tasks finish, one after the other.
		for range 4 {
			<-slots
		}
	}()
	require.Equal(t, 10, reserveSlots(context.Background(), slots, 10, time.Hour, nil))
	<-freed
	require.Len(t, slots, 10)
}

// The wait is bounded: slots that stay busy do not hold the claim back, and
// neither does a stopping worker.
func TestReserveSlotsWaitIsBounded(t *testing.T) {
	t.Parallel()
	slots := slotsHeld(10, 5)
	require.Equal(t, 6, reserveSlots(context.Background(), slots, 10, time.Millisecond, nil))
	require.Len(t, slots, 10)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	slots = slotsHeld(10, 10)
	require.Equal(t, 1, reserveSlots(ctx, slots, 10, time.Hour, nil))
}

// A wake-up ends the wait: new work may belong to another key, and it
// should not wait for the flood's tasks to free their slots.
func TestReserveSlotsWaitEndsAtAWakeUp(t *testing.T) {
	t.Parallel()
	woken := make(chan struct{})
	close(woken)
	slots := slotsHeld(10, 5)
	require.Equal(t, 6, reserveSlots(context.Background(), slots, 10, time.Hour, woken))
}
