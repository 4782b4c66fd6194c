package soak

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/harvest-run/harvest/tools/internal/child"
)

// Command is how a role (gateway or worker) is started: a program and the
// arguments that go before nothing else (the binaries take none; the harvest
// CLI re-executes itself with "bench soak --role ...").
type Command struct {
	Path string
	Args []string
}

// Binaries are the commands of the two server roles.
type Binaries struct {
	Gateway Command
	Worker  Command
}

// Proc is one running gateway or worker process.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	log  *tailBuffer
	done chan struct{}
	err  error
}

// StartProc starts a process of the caller's beside the fleet (a NATS
// node, a worker set up otherwise) as the fleet starts its own: in its own
// process group, killed if the harness dies, the tail of its output kept.
// The caller stops it.
func StartProc(name string, c Command, env []string) (*Proc, error) { return startProc(name, c, env) }

// startProc starts c with env and keeps the tail of its stderr and stdout.
func startProc(name string, c Command, env []string) (*Proc, error) {
	p := &Proc{Name: name, cmd: exec.Command(c.Path, c.Args...), log: newTailBuffer(256 << 10), done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout = p.log
	p.cmd.Stderr = p.log
	child.Detach(p.cmd)
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("soak: start %s: %w", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process (nothing once it has exited).
func (p *Proc) Signal(sig syscall.Signal) error {
	if p.Exited() {
		return nil
	}
	return p.cmd.Process.Signal(sig)
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Stop resumes a paused process, kills it and waits for it.
func (p *Proc) Stop() {
	_ = p.Signal(syscall.SIGCONT)
	_ = p.Signal(syscall.SIGKILL)
	<-p.done
}

// Log returns the tail of what the process wrote.
func (p *Proc) Log() string { return p.log.String() }

// RSS returns the resident set size of the process in bytes (0 when it is
// not running or /proc is not there).
func (p *Proc) RSS() int64 {
	if p.Exited() {
		return 0
	}
	return rssOf(p.Pid())
}

func rssOf(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			fields := strings.Fields(rest)
			if len(fields) > 0 {
				kb, _ := strconv.ParseInt(fields[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// ExitError is the process's exit error once it has exited.
func (p *Proc) ExitError() error {
	select {
	case <-p.done:
		return p.err
	default:
		return errors.New("still running")
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   bytes.Buffer
	cut bool
}

func newTailBuffer(max int) *tailBuffer { return &tailBuffer{max: max} }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b.Write(p)
	if over := t.b.Len() - t.max; over > 0 {
		rest := append([]byte(nil), t.b.Bytes()[over:]...)
		t.b.Reset()
		t.b.Write(rest)
		t.cut = true
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cut {
		return "[...]" + t.b.String()
	}
	return t.b.String()
}
