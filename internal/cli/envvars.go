package cli

import "github.com/harvest-run/harvest/internal/config"

// EnvSpecs returns the configuration structs the harvest commands read
// from the environment (prefix HARVEST_), for the configuration reference
// and the compose file's check (internal/envdoc lists their variables).
// A command that reads a new struct must add it here.
func EnvSpecs() []any {
	return []any{
		&config.Common{},
		&adminConfig{},
		&admissionEnv{},
		&gatewayEnv{},
		&devEnv{},
	}
}
