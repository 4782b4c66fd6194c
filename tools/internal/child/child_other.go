//go:build !linux

package child

import (
	"os/exec"
	"syscall"
)

// Detach puts the child in its own process group (see proc_linux.go; only
// Linux can also tie the child's life to the harness's).
func Detach(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}
