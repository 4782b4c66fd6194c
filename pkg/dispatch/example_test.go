package dispatch_test

import (
	"fmt"

	"github.com/harvest-run/harvest/pkg/dispatch"
)

// Subjects names every NATS subject; names that could mean something in a
// subject are encoded into one safe token.
func ExampleSubjects() {
	s := dispatch.Subjects{} // the default prefix, harvest
	fmt.Println(s.Start("acme"))
	fmt.Println(s.Wake(0, "orders"))
	fmt.Println(s.Dispatch(1, "orders.eu"))
	fmt.Println(s.Runs("acme", "run-1"))
	fmt.Println(s.RunsOf("acme"))
	fmt.Println(s.Admission())
	// Output:
	// harvest.start.acme
	// harvest.wake.0.orders
	// harvest.dispatch.1.orders%2Eeu
	// harvest.runs.acme.run-1
	// harvest.runs.acme.>
	// harvest.admission
}
