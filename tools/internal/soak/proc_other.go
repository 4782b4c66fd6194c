//go:build !linux

package soak

import (
	"os/exec"
	"syscall"
)

// detach puts the child in its own process group (see proc_linux.go; only
// Linux can also tie the child's life to the harness's).
func detach(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}
