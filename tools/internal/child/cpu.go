package child

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// clockTicks is the unit of the CPU times in /proc/<pid>/stat. Linux has
// reported them at 100 per second on every common architecture for
// decades (USER_HZ), whatever the kernel's own tick rate.
const clockTicks = 100

// stat is one process's line of /proc/<pid>/stat: its command name, its
// parent, its own CPU ticks and those of the children it has reaped.
type stat struct {
	comm              string
	ppid              int
	own, reapedByThis int64
}

func readStat(path string) (int, stat, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, stat{}, false
	}
	// pid (comm) state ppid ... : comm may hold spaces, so split after the
	// last parenthesis.
	open, shut := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || shut < open {
		return 0, stat{}, false
	}
	f := bytes.Fields(b[shut+1:])
	// After comm: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
	if len(f) < 15 {
		return 0, stat{}, false
	}
	num := func(i int) int64 { v, _ := strconv.ParseInt(string(f[i]), 10, 64); return v }
	pid, _ := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
	return pid, stat{comm: string(b[open+1 : shut]), ppid: int(num(1)), own: num(11) + num(12), reapedByThis: num(13) + num(14)}, true
}

// CPU is the CPU time process pid has used so far (zero when it cannot
// be read: gone, or not Linux).
func CPU(pid int) time.Duration {
	_, s, ok := readStat(fmt.Sprintf("/proc/%d/stat", pid))
	if !ok {
		return 0
	}
	return time.Duration(s.own) * time.Second / clockTicks
}

// PostgresCPU is the CPU time of the PostgreSQL server running on this
// machine: every postgres process's own time plus, for the postmaster, the
// time of the children it has reaped, so backends that ended still count.
// Zero when no postgres process is visible.
func PostgresCPU() time.Duration {
	paths, _ := filepath.Glob("/proc/[0-9]*/stat")
	procs := map[int]stat{}
	for _, path := range paths {
		if pid, s, ok := readStat(path); ok && s.comm == "postgres" {
			procs[pid] = s
		}
	}
	var ticks int64
	for _, p := range procs {
		ticks += p.own
		if _, child := procs[p.ppid]; !child {
			ticks += p.reapedByThis // the postmaster
		}
	}
	return time.Duration(ticks) * time.Second / clockTicks
}
