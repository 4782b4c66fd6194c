package auth

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// writeFile replaces dir/tokens.json atomically, as an operator should.
func writeFile(t *testing.T, dir, content string) string {
	t.Helper()
	path := filepath.Join(dir, "tokens.json")
	tmp, err := os.CreateTemp(dir, "tokens-*.tmp")
	require.NoError(t, err)
	_, err = tmp.WriteString(content)
	require.NoError(t, err)
	require.NoError(t, tmp.Close())
	require.NoError(t, os.Rename(tmp.Name(), path))
	return path
}

func entry(name, secret, tenant string, privs ...Privilege) string {
	quoted := make([]string, len(privs))
	for i, p := range privs {
		quoted[i] = `"` + string(p) + `"`
	}
	return fmt.Sprintf(`{"name": %q, "sha256": %q, "tenant": %q, "privileges": [%s]}`,
		name, HashSecret(secret), tenant, strings.Join(quoted, ", "))
}

func file(entries ...string) string { return "[\n" + strings.Join(entries, ",\n") + "\n]\n" }

// watched runs Store.Watch on a fresh tokens file and hands its reports
// over a channel. The watch stops, and is waited for, when the test ends.
type watched struct {
	store   *Store
	dir     string
	path    string
	reloads chan Reload
	logs    *syncBuffer
}

func startWatch(t *testing.T, initial string, requests <-chan struct{}) *watched {
	t.Helper()
	w := &watched{dir: t.TempDir(), reloads: make(chan Reload, 16), logs: &syncBuffer{}}
	w.path = writeFile(t, w.dir, initial)
	var err error
	w.store, err = OpenStore(w.path)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- w.store.Watch(ctx, w.path, 5*time.Millisecond, WatchOptions{
			Requests: requests,
			OnReload: func(r Reload) { w.reloads <- r },
			Logger:   slog.New(slog.NewTextHandler(w.logs, nil)),
		})
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return w
}

func (w *watched) next(t *testing.T) Reload {
	t.Helper()
	select {
	case r := <-w.reloads:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no reload reported")
		return Reload{}
	}
}

// quiet asserts that no reload is pending. It is only meaningful after an
// event that happened later than anything that could have produced one.
func (w *watched) quiet(t *testing.T) {
	t.Helper()
	select {
	case r := <-w.reloads:
		t.Fatalf("unexpected reload: %+v", r)
	default:
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestStoreReplace(t *testing.T) {
	t.Parallel()
	s := NewStore(nil)
	_, err := s.Authenticate("a")
	require.ErrorIs(t, err, ErrUnknownToken, "no set means nobody gets in")
	require.Empty(t, s.Tenants())

	set, err := ParseTokens([]byte(file(entry("a", "a", "acme", RunsRead))))
	require.NoError(t, err)
	s.Replace(set)
	p, err := s.Authenticate("a")
	require.NoError(t, err)
	require.Equal(t, "acme", p.Tenant)
	require.Equal(t, []string{"acme"}, s.Tenants())
	require.Same(t, set, s.Current())
}

func TestOpenStoreRefusesBadFile(t *testing.T) {
	t.Parallel()
	path := writeFile(t, t.TempDir(), file(entry("a", "a", "acme", ConfigRead)))
	_, err := OpenStore(path)
	require.Error(t, err)
	require.Contains(t, err.Error(), "config:read")
}

func TestWatchAddsAndRotatesTokens(t *testing.T) {
	t.Parallel()
	w := startWatch(t, file(entry("acme-ci", "old", "acme", RunsStart)), nil)

	// Add a tenant and rotate acme's secret in one step: both the old
	// and the new secret work while the owner switches over.
	writeFile(t, w.dir, file(
		entry("acme-ci", "old", "acme", RunsStart),
		entry("acme-ci-2", "new", "acme", RunsStart),
		entry("globex", "g", "globex", RunsRead),
	))
	r := w.next(t)
	require.NoError(t, r.Err)
	require.False(t, r.Requested)
	require.Equal(t, w.path, r.Path)
	require.Equal(t, 3, r.Tokens)
	require.Equal(t, 2, r.Tenants)
	require.Equal(t, []string{"acme", "globex"}, w.store.Tenants())
	for _, secret := range []string{"old", "new", "g"} {
		_, err := w.store.Authenticate(secret)
		require.NoError(t, err, secret)
	}

	// Retire the old secret.
	writeFile(t, w.dir, file(
		entry("acme-ci-2", "new", "acme", RunsStart),
		entry("globex", "g", "globex", RunsRead),
	))
	r = w.next(t)
	require.NoError(t, r.Err)
	require.Equal(t, 2, r.Tokens)
	_, err := w.store.Authenticate("old")
	require.ErrorIs(t, err, ErrUnknownToken)
	p, err := w.store.Authenticate("new")
	require.NoError(t, err)
	require.Equal(t, "acme-ci-2", p.Name)
	require.Contains(t, w.logs.String(), "tokens file loaded")
}

func TestWatchKeepsPreviousSetOnBadFile(t *testing.T) {
	t.Parallel()
	w := startWatch(t, file(entry("acme-ci", "s", "acme", RunsStart)), nil)
	before := w.store.Current()

	// A tenant token with an admin privilege: the whole file is refused.
	writeFile(t, w.dir, file(
		entry("acme-ci", "s", "acme", RunsStart),
		entry("acme-admin", "evil", "acme", ConfigWrite),
	))
	r := w.next(t)
	require.Error(t, r.Err)
	require.Contains(t, r.Err.Error(), `entry 1 ("acme-admin")`)
	require.Contains(t, r.Err.Error(), w.path)
	require.Equal(t, 1, r.Tokens, "counts describe the set still in force")
	require.Same(t, before, w.store.Current())
	_, err := w.store.Authenticate("evil")
	require.ErrorIs(t, err, ErrUnknownToken)
	_, err = w.store.Authenticate("s")
	require.NoError(t, err)
	require.Contains(t, w.logs.String(), "previous tokens stay in force")

	// Half-written JSON is refused too; the same bad content is reported
	// once, not at every poll.
	writeFile(t, w.dir, `[{"name": "acme-ci", "sha256": "`)
	r = w.next(t)
	require.ErrorContains(t, r.Err, "JSON array")

	// A missing file is an error as well, and the set stays.
	require.NoError(t, os.Remove(w.path))
	r = w.next(t)
	require.ErrorIs(t, r.Err, os.ErrNotExist)
	require.Same(t, before, w.store.Current())

	// A good file is picked up again. Everything reported before it was
	// reported once only.
	writeFile(t, w.dir, file(entry("acme-ci", "s2", "acme", RunsStart)))
	r = w.next(t)
	require.NoError(t, r.Err)
	w.quiet(t)
	_, err = w.store.Authenticate("s2")
	require.NoError(t, err)
}

func TestWatchRequestsReload(t *testing.T) {
	t.Parallel()
	requests := make(chan struct{})
	w := startWatch(t, file(entry("a", "a", "acme", RunsStart)), requests)

	// A request re-reads even an unchanged file and reports it.
	requests <- struct{}{}
	r := w.next(t)
	require.True(t, r.Requested)
	require.NoError(t, r.Err)
	require.Equal(t, 1, r.Tokens)

	// A request with a bad file in place reports the error each time.
	writeFile(t, w.dir, `not json`)
	r = w.next(t)
	require.False(t, r.Requested)
	require.Error(t, r.Err)
	requests <- struct{}{}
	r = w.next(t)
	require.True(t, r.Requested)
	require.Error(t, r.Err)
	_, err := w.store.Authenticate("a")
	require.NoError(t, err)
}

func TestWatchPicksUpChangeMadeBeforeItStarted(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := writeFile(t, dir, file(entry("a", "a", "acme", RunsStart)))
	store, err := OpenStore(path)
	require.NoError(t, err)
	writeFile(t, dir, file(entry("b", "b", "globex", RunsStart)))

	reloads := make(chan Reload, 1)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		// A long interval: only the first look at the file can see it.
		done <- store.Watch(ctx, path, time.Hour, WatchOptions{
			OnReload: func(r Reload) { reloads <- r },
			Logger:   slog.New(slog.DiscardHandler),
		})
	}()
	r := <-reloads
	require.NoError(t, r.Err)
	_, err = store.Authenticate("b")
	require.NoError(t, err)
	cancel()
	require.NoError(t, <-done)
}

func TestSignalRequestsStopsWithContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	ch := SignalRequests(ctx)
	require.NotNil(t, ch)
	cancel()
	// goleak (TestMain) checks that the forwarding goroutine has ended.
}
