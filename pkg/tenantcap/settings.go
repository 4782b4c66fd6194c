package tenantcap

import (
	"fmt"
	"time"
)

// Settings are the process-level knobs of admission, read from the
// environment when the struct is embedded in a binary's envconfig
// configuration (HARVEST_MAX_RUNS, HARVEST_ADMISSION_REFRESH,
// HARVEST_ADMISSION_RELOAD).
type Settings struct {
	// MaxRuns is the system limit on unfinished runs. It is read-only:
	// only the environment sets it, no API changes it.
	MaxRuns int `envconfig:"MAX_RUNS" default:"128" desc:"system limit on unfinished runs over all tenants (read-only at run time)"`
	// Refresh is how often the totals of the other shards are re-read; it
	// bounds how stale the system-wide count is (see docs/admission.md).
	Refresh time.Duration `envconfig:"ADMISSION_REFRESH" default:"100ms" desc:"how often a gateway re-reads every shard's count of unfinished runs"`
	// Reload is how often a gateway re-reads the configuration from shard 0
	// in case it missed a change announced over NATS.
	Reload time.Duration `envconfig:"ADMISSION_RELOAD" default:"5s" desc:"how often a gateway re-reads the admission configuration (fallback for a lost NATS message)"`
}

// Defaults of Settings.
const (
	DefaultMaxRuns = 128
	DefaultRefresh = 100 * time.Millisecond
	DefaultReload  = 5 * time.Second
)

// DefaultSettings returns the defaults of the Settings fields.
func DefaultSettings() Settings {
	return Settings{MaxRuns: DefaultMaxRuns, Refresh: DefaultRefresh, Reload: DefaultReload}
}

// Validate names the variable of a bad setting.
func (s Settings) Validate() error {
	if s.MaxRuns < 1 {
		return fmt.Errorf("HARVEST_MAX_RUNS: %d must be at least 1", s.MaxRuns)
	}
	if s.Refresh <= 0 {
		return fmt.Errorf("HARVEST_ADMISSION_REFRESH: %s must be positive", s.Refresh)
	}
	if s.Reload <= 0 {
		return fmt.Errorf("HARVEST_ADMISSION_RELOAD: %s must be positive", s.Reload)
	}
	return nil
}
