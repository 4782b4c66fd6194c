package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// EnvOSUser names the environment variable that chooses the unprivileged
// user the server runs as when the process is root.
const EnvOSUser = "HARVEST_PG_OS_USER"

// DefaultOSUser is the unprivileged user created and used when the process
// is root and neither Options.OSUser nor HARVEST_PG_OS_USER names another.
const DefaultOSUser = "harvestpg"

const rootAdvice = "run as a non-root user, or create an unprivileged user and set " + EnvOSUser + "=name"

// osUser is the identity the server binaries run as.
type osUser struct {
	name     string
	uid, gid uint32
}

// userMu serialises user creation inside one process; other processes racing
// to create the same user are handled by looking the user up again.
var userMu sync.Mutex

// runAsUser finds, or creates, the unprivileged user to run PostgreSQL as.
func runAsUser(ctx context.Context, name string) (osUser, error) {
	if name == "" {
		name = os.Getenv(EnvOSUser)
	}
	if name == "" {
		name = DefaultOSUser
	}
	userMu.Lock()
	defer userMu.Unlock()

	u, lookErr := lookupUser(name)
	if lookErr != nil {
		var unknown user.UnknownUserError
		if !errors.As(lookErr, &unknown) {
			return osUser{}, fmt.Errorf("pgcluster: PostgreSQL refuses to run as root and looking up user %q failed: %v: %s", name, lookErr, rootAdvice)
		}
		createErr := createSystemUser(ctx, name)
		// Another process may have created the user meanwhile; what counts
		// is whether it exists now.
		u, lookErr = lookupUser(name)
		if lookErr != nil {
			return osUser{}, fmt.Errorf("pgcluster: PostgreSQL refuses to run as root and the unprivileged user %q could not be created (%v): %s", name, createErr, rootAdvice)
		}
	}
	if u.uid == 0 {
		return osUser{}, fmt.Errorf("pgcluster: user %q has uid 0, and PostgreSQL refuses to run as root: %s", name, rootAdvice)
	}
	return u, nil
}

func lookupUser(name string) (osUser, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return osUser{}, err
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return osUser{}, fmt.Errorf("user %q: uid %q: %w", name, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return osUser{}, fmt.Errorf("user %q: gid %q: %w", name, u.Gid, err)
	}
	return osUser{name: name, uid: uint32(uid), gid: uint32(gid)}, nil
}

// createSystemUser adds a system account without a home or a login shell,
// with useradd, or with Debian's adduser where useradd is missing or fails.
func createSystemUser(ctx context.Context, name string) error {
	attempts := [][]string{
		{"useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name},
		{"adduser", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name},
	}
	var errs []error
	for _, args := range attempts {
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %v: %s", args[0], err, strings.TrimSpace(out.String())))
	}
	return errors.Join(errs...)
}

// credential makes a command run as u, with no supplementary groups.
func (u osUser) credential() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.uid, Gid: u.gid}}
}

// checkTraversable verifies that every directory from dir up to the root
// can be searched by uid/gid, judged from permission bits. It catches the
// common case of a parent made with mode 0700 by root (os.MkdirTemp does
// that). Supplementary groups and ACLs are ignored.
func checkTraversable(dir string, uid, gid uint32) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		perm := fi.Mode().Perm()
		ok := perm&0o001 != 0
		if st, isUnix := fi.Sys().(*syscall.Stat_t); isUnix {
			switch {
			case st.Uid == uid:
				ok = perm&0o100 != 0
			case st.Gid == gid:
				ok = perm&0o010 != 0
			}
		}
		if !ok {
			return fmt.Errorf("directory %s (mode %v) cannot be traversed by uid %d", d, perm, uid)
		}
		if parent := filepath.Dir(d); parent == d {
			return nil
		}
	}
}
