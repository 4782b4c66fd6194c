package fairkeys_test

import (
	"fmt"
	"time"

	"github.com/harvest-run/harvest/pkg/fairkeys"
)

// The reference model of the fair claim: a flood of one key and a trickle
// of another, the trickle's key with weight 2. Claims alternate by start
// tag, so the trickle is not stuck behind the flood, and its weight gives
// it two claims for each of the flood's while both have work.
func ExampleModel() {
	m := fairkeys.NewModel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	id := int64(0)
	add := func(key string, n int) {
		for range n {
			id++
			m.Insert(fairkeys.Task{ID: id, Queue: "q", Key: key, DueAt: t0})
		}
	}
	add("flood", 6)
	add("trickle", 4)
	m.SetWeight("q", "trickle", 2)
	for range 9 {
		r := m.Claim(fairkeys.ClaimRequest{Queue: "q", Worker: "w", Now: t0.Add(time.Second), Fair: true})
		fmt.Print(r.Task.Key, " ")
	}
	fmt.Println()
	// Output:
	// flood trickle trickle flood trickle trickle flood flood flood
}

// Keys and queue names are checked before they are stored; a refusal says
// which rule the value broke.
func ExampleValidateKey() {
	for _, k := range []string{"tenant-42", "", " padded", "a\u202eb"} {
		if err := fairkeys.ValidateKey(k); err != nil {
			fmt.Printf("%q: %v\n", k, err)
			continue
		}
		fmt.Printf("%q: ok\n", k)
	}
	// Output:
	// "tenant-42": ok
	// "": must not be empty
	// " padded": must not start or end with whitespace
	// "a\u202eb": must not contain bidirectional control characters (U+061C, U+200E, U+200F, U+202A to U+202E, U+2066 to U+2069)
}
