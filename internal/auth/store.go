package auth

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"
)

// DefaultWatchInterval is how often Watch looks at the tokens file when it
// is given no interval.
const DefaultWatchInterval = 2 * time.Second

// Store serves the token set in force and lets it be replaced while
// requests are being authenticated. It is safe for concurrent use.
type Store struct {
	cur atomic.Pointer[TokenSet]
}

// NewStore returns a store serving set. A nil set means no tokens at all,
// so that every request is refused until a set is loaded.
func NewStore(set *TokenSet) *Store {
	s := &Store{}
	s.Replace(set)
	return s
}

// OpenStore loads the tokens file at path and returns a store serving it.
// Call Watch to follow later changes to the file.
func OpenStore(path string) (*Store, error) {
	set, err := LoadTokens(path)
	if err != nil {
		return nil, err
	}
	return NewStore(set), nil
}

// Current returns the token set in force.
func (s *Store) Current() *TokenSet { return s.cur.Load() }

// Replace puts set in force at once; a nil set means no tokens.
func (s *Store) Replace(set *TokenSet) {
	if set == nil {
		set = &TokenSet{byHash: map[[sha256.Size]byte]int{}}
	}
	s.cur.Store(set)
}

// Authenticate checks bearer against the token set in force; see
// TokenSet.Authenticate.
func (s *Store) Authenticate(bearer string) (Principal, error) {
	return s.Current().Authenticate(bearer)
}

// Tenants returns the registered tenants of the token set in force.
func (s *Store) Tenants() []string { return s.Current().Tenants() }

// Reload describes one attempt of Watch to put a new version of the tokens
// file in force.
type Reload struct {
	// Path is the tokens file.
	Path string
	// Requested is true when the attempt answered a reload request (such
	// as SIGHUP), false when a change of the file's content caused it.
	Requested bool
	// Err is why the file was refused; the previous set then stays in
	// force. Nil when the new set was put in force.
	Err error
	// Tokens and Tenants count the tokens and registered tenants of the
	// set in force after the attempt.
	Tokens, Tenants int
}

// WatchOptions are the optional parts of Watch.
type WatchOptions struct {
	// Requests asks for a re-read now, whether or not the file changed;
	// SignalRequests turns SIGHUP into such requests. Nil means none.
	Requests <-chan struct{}
	// OnReload, when set, is called after every attempt to put a new
	// version of the file in force (not on polls that find the content
	// unchanged), from Watch's goroutine.
	OnReload func(Reload)
	// Logger receives a line for every attempt: info when a set is put in
	// force, error when a file is refused. Nil means slog.Default().
	Logger *slog.Logger
}

// Watch keeps the store in step with the tokens file at path until ctx
// ends, then returns nil.
//
// Every interval (DefaultWatchInterval when not positive) it reads the file
// and compares a SHA-256 of its content with that of the set in force;
// reading the whole small file is simpler and more reliable than trusting
// modification times. A changed file is parsed and, when valid, put in
// force at once, so tokens can be added, removed and rotated without a
// restart. A file that cannot be read or is refused is reported (logged,
// and passed to OnReload) and the previous set stays in force; the same bad
// content is reported once, not at every poll. A request on opts.Requests
// re-reads the file at once and reports the outcome even when nothing
// changed.
//
// Writers should replace the file atomically (write a temporary file, then
// rename it); a poll that catches a half-written file reports an error and
// keeps the old set until the next poll sees the whole file.
func (s *Store) Watch(ctx context.Context, path string, interval time.Duration, opts WatchOptions) error {
	if interval <= 0 {
		interval = DefaultWatchInterval
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	w := watcher{store: s, path: path, opts: opts, log: log}
	w.poll(false)
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			w.poll(false)
		case <-opts.Requests:
			w.poll(true)
		}
	}
}

type watcher struct {
	store *Store
	path  string
	opts  WatchOptions
	log   *slog.Logger

	// The last content refused, or the last read error, so that a bad
	// file is reported once rather than at every poll.
	badDigest [sha256.Size]byte
	hasBad    bool
	readErr   string
}

func (w *watcher) poll(requested bool) {
	data, err := os.ReadFile(w.path)
	if err != nil {
		if !requested && err.Error() == w.readErr {
			return
		}
		w.readErr = err.Error()
		w.report(requested, fmt.Errorf("auth: tokens file: %w", err))
		return
	}
	w.readErr = ""
	digest := sha256.Sum256(data)
	if !requested {
		if digest == w.store.Current().digest {
			w.hasBad = false
			return
		}
		if w.hasBad && digest == w.badDigest {
			return
		}
	}
	set, err := ParseTokens(data)
	if err != nil {
		w.badDigest, w.hasBad = digest, true
		w.report(requested, fmt.Errorf("auth: tokens file %s: %w", w.path, err))
		return
	}
	w.hasBad = false
	w.store.Replace(set)
	w.report(requested, nil)
}

func (w *watcher) report(requested bool, err error) {
	cur := w.store.Current()
	r := Reload{Path: w.path, Requested: requested, Err: err, Tokens: cur.Len(), Tenants: len(cur.tenants)}
	if err != nil {
		w.log.Error("auth: tokens file refused, previous tokens stay in force",
			"path", w.path, "requested", requested, "err", err)
	} else {
		w.log.Info("auth: tokens file loaded",
			"path", w.path, "requested", requested, "tokens", r.Tokens, "tenants", r.Tenants)
	}
	if w.opts.OnReload != nil {
		w.opts.OnReload(r)
	}
}

// SignalRequests returns a channel for WatchOptions.Requests that receives
// a value each time the process gets one of sigs (SIGHUP when none are
// given). Signals that arrive while a request is still pending are merged
// into it. The signals are handed back to their default handling, and the
// channel stops receiving, once ctx ends.
func SignalRequests(ctx context.Context, sigs ...os.Signal) <-chan struct{} {
	if len(sigs) == 0 {
		sigs = []os.Signal{syscall.SIGHUP}
	}
	in := make(chan os.Signal, 1)
	signal.Notify(in, sigs...)
	out := make(chan struct{}, 1)
	go func() {
		defer signal.Stop(in)
		for {
			select {
			case <-ctx.Done():
				return
			case <-in:
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out
}
