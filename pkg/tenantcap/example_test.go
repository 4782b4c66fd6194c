package tenantcap_test

import (
	"fmt"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// The specification's worked examples, with 128 Max Workflow Runs and
// eight tenants: under Static each tenant may hold 16; under Dynamic with
// TFM 3 and 120 runs in flight a tenant's limit is 24, so a tenant holding
// 29 is refused while one holding 1 is admitted.
func ExampleDecide() {
	static := tenantcap.Config{Algorithm: api.AlgorithmStatic, TFM: 1}
	limit, _ := tenantcap.Limit(static, 128, 8, 40)
	d := tenantcap.Decide(static, 128, 8, 40, 16)
	fmt.Println("static:", limit, d.Admit, d.Reason)

	dynamic := tenantcap.Config{Algorithm: api.AlgorithmDynamic, TFM: 3}
	limit, _ = tenantcap.Limit(dynamic, 128, 8, 120)
	heavy := tenantcap.Decide(dynamic, 128, 8, 120, 29)
	light := tenantcap.Decide(dynamic, 128, 8, 120, 1)
	fmt.Println("dynamic:", limit, heavy.Admit, light.Admit)

	full := tenantcap.Decide(tenantcap.DefaultConfig(), 128, 8, 128, 0)
	fmt.Println("no_limit at max_runs:", full.Admit, full.Reason)
	// Output:
	// static: 16 false tenant_limit
	// dynamic: 24 false true
	// no_limit at max_runs: false system_limit
}
