// Package config reads the settings shared by every Harvest binary from the
// environment (prefix HARVEST_) and checks them, naming the variable at fault.
package config
