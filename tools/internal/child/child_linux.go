package child

import (
	"os/exec"
	"syscall"
)

// Detach puts the child in its own process group, so that a Ctrl-C at the
// terminal reaches only the harness, which then stops the fleet in order
// and reports; and asks the kernel to kill the child if the harness dies
// without stopping it, so that no gateway or worker outlives a killed run.
func Detach(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
