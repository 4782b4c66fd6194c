package auth

import (
	"encoding/base64"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestMain checks that Watch and SignalRequests leave no goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestParsePrivilege(t *testing.T) {
	t.Parallel()
	for _, p := range AllPrivileges() {
		got, err := ParsePrivilege(string(p))
		require.NoError(t, err)
		require.Equal(t, p, got)
		require.True(t, p.Valid())
	}
	for _, bad := range []string{"", "runs", "RUNS:START", "runs:write", " runs:read"} {
		_, err := ParsePrivilege(bad)
		require.Error(t, err, bad)
		require.Contains(t, err.Error(), `"`+bad+`"`)
		require.Contains(t, err.Error(), "runs:start", "the error lists the known names")
		require.False(t, Privilege(bad).Valid())
	}
	require.True(t, ConfigRead.AdminOnly())
	require.True(t, ConfigWrite.AdminOnly())
	require.False(t, WeightsWrite.AdminOnly())
}

func TestPrivilegesSet(t *testing.T) {
	t.Parallel()
	var empty Privileges
	require.Empty(t, empty.List())
	require.Equal(t, "", empty.String())

	s := NewPrivileges(RunsRead, ConfigWrite, RunsRead, Privilege("bogus"))
	require.True(t, s.Has(RunsRead))
	require.True(t, s.Has(ConfigWrite))
	require.False(t, s.Has(RunsStart))
	require.False(t, s.Has(Privilege("bogus")))
	require.Equal(t, []Privilege{RunsRead, ConfigWrite}, s.List())
	require.Equal(t, "runs:read,config:write", s.String())
	require.Equal(t, s, NewPrivileges(ConfigWrite, RunsRead))

	all := NewPrivileges(AllPrivileges()...)
	require.Equal(t, AllPrivileges(), all.List())
}

func TestValidateTenant(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"a", "acme", "ACME_co-2", strings.Repeat("x", 64)} {
		require.NoError(t, ValidateTenant(ok), ok)
	}
	for _, bad := range []string{"", strings.Repeat("x", 65), "ac me", "acme.eu", "a*", "a>", "é", "a/b"} {
		require.Error(t, ValidateTenant(bad), bad)
	}
}

func TestHashSecret(t *testing.T) {
	t.Parallel()
	// The SHA-256 test vector for "abc".
	require.Equal(t, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", HashSecret("abc"))
}

func TestNewSecret(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 100 {
		s, err := NewSecret()
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(s, SecretPrefix), s)
		raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(s, SecretPrefix))
		require.NoError(t, err, "URL-safe base64 without padding")
		require.Len(t, raw, 32)
		require.False(t, seen[s])
		seen[s] = true
	}
}

func TestBearerToken(t *testing.T) {
	t.Parallel()
	for header, want := range map[string]string{
		"Bearer hv_abc":    "hv_abc",
		"bearer hv_abc":    "hv_abc",
		"BEARER  hv_abc  ": "hv_abc",
	} {
		got, ok := BearerToken(header)
		require.True(t, ok, header)
		require.Equal(t, want, got)
	}
	for _, header := range []string{"", "Bearer", "Bearer ", "Basic dXNlcjpwdw==", "hv_abc"} {
		_, ok := BearerToken(header)
		require.False(t, ok, header)
	}
}

func TestExampleFile(t *testing.T) {
	t.Parallel()
	set, err := LoadTokens("testdata/tokens.example.json")
	require.NoError(t, err)
	require.Equal(t, 2, set.Len())
	require.Equal(t, []string{"acme"}, set.Tenants())

	p, err := set.Authenticate("acme-ci-example-secret")
	require.NoError(t, err)
	require.Equal(t, Principal{Name: "acme-ci", Tenant: "acme", Privileges: NewPrivileges(RunsStart, RunsRead)}, p)
	require.False(t, p.Admin())

	p, err = set.Authenticate("ops-example-secret")
	require.NoError(t, err)
	require.True(t, p.Admin())
	require.True(t, p.Has(ConfigWrite))
	require.False(t, p.Has(RunsStart))

	// The example in the package documentation is this file.
	doc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	var block []string
	in := false
	for line := range strings.SplitSeq(string(doc), "\n") {
		switch {
		case line == "//\t[":
			in = true
		case !in:
			continue
		case !strings.HasPrefix(line, "//\t"):
			in = false
			continue
		}
		if in {
			block = append(block, strings.TrimPrefix(line, "//\t"))
		}
	}
	want, err := os.ReadFile("testdata/tokens.example.json")
	require.NoError(t, err)
	require.Equal(t, string(want), strings.Join(block, "\n")+"\n")
}

func TestAuthenticate(t *testing.T) {
	t.Parallel()
	set, err := ParseTokens([]byte(`[
		{"name": "acme-ci", "sha256": "` + HashSecret("s-acme") + `", "tenant": "acme", "privileges": ["runs:start", "runs:read"]},
		{"name": "acme-ro", "sha256": "` + strings.ToUpper(HashSecret("s-acme-ro")) + `", "tenant": "acme", "privileges": ["runs:read"]},
		{"name": "globex", "sha256": "` + HashSecret("s-globex") + `", "tenant": "globex", "privileges": ["runs:start", "weights:read"]},
		{"name": "root", "sha256": "` + HashSecret("s-root") + `", "tenant": "", "privileges": ["config:read", "config:write"]},
		{"name": "ops@example.com", "sha256": "` + HashSecret("s-ops") + `", "privileges": ["weights:write"]}
	]`))
	require.NoError(t, err)
	require.Equal(t, 5, set.Len())
	require.Equal(t, []string{"acme", "globex"}, set.Tenants(), "distinct, sorted, admins excluded")

	p, err := set.Authenticate("s-acme")
	require.NoError(t, err)
	require.Equal(t, "acme-ci", p.Name)
	require.Equal(t, "acme", p.Tenant)
	require.True(t, p.Has(RunsStart))
	require.False(t, p.Has(WeightsRead))
	require.False(t, p.Admin())

	p, err = set.Authenticate("s-acme-ro")
	require.NoError(t, err, "hashes are accepted in upper case")
	require.Equal(t, "acme-ro", p.Name)

	p, err = set.Authenticate("s-root")
	require.NoError(t, err)
	require.True(t, p.Admin())
	require.Equal(t, NewPrivileges(ConfigRead, ConfigWrite), p.Privileges)

	p, err = set.Authenticate("s-ops")
	require.NoError(t, err)
	require.True(t, p.Admin())
	require.Equal(t, "ops@example.com", p.Name)

	for _, bad := range []string{"s-nobody", HashSecret("s-acme"), "s-acme ", strings.Repeat("x", MaxSecretLen+1)} {
		p, err := set.Authenticate(bad)
		require.ErrorIs(t, err, ErrUnauthenticated)
		require.ErrorIs(t, err, ErrUnknownToken)
		require.Equal(t, Principal{}, p)
		require.False(t, p.Admin(), "the zero principal is nobody")
	}
	_, err = set.Authenticate("")
	require.ErrorIs(t, err, ErrUnauthenticated)
	require.ErrorIs(t, err, ErrMissingToken)
	require.False(t, errors.Is(ErrMissingToken, ErrUnknownToken))
}

func TestParseTokensEmptyArray(t *testing.T) {
	t.Parallel()
	set, err := ParseTokens([]byte(" [] "))
	require.NoError(t, err)
	require.Equal(t, 0, set.Len())
	require.Empty(t, set.Tenants())
	_, err = set.Authenticate("anything")
	require.ErrorIs(t, err, ErrUnknownToken)
}

func TestParseTokensRefused(t *testing.T) {
	t.Parallel()
	h1, h2 := HashSecret("one"), HashSecret("two")
	cases := []struct {
		name string
		file string
		want []string // substrings of the error
		idx  int      // entry index in the EntryError; -1 when not per entry
		fld  string
	}{
		{"not json", `{`, []string{"JSON array"}, -1, ""},
		{"object", `{"tokens": []}`, []string{"JSON array"}, -1, ""},
		{"null", `null`, []string{"not null"}, -1, ""},
		{"empty file", ``, []string{"JSON array"}, -1, ""},
		{"trailing data", `[] []`, []string{"JSON array"}, -1, ""},
		{"unknown field", `[{"name": "a", "sha256": "` + h1 + `", "tennant": "acme", "privileges": ["runs:read"]}]`,
			[]string{`entry 0 ("a")`, `"tennant"`, "unknown field"}, 0, "tennant"},
		{"wrong type", `[{"name": "a", "sha256": "` + h1 + `", "privileges": "runs:read"}]`,
			[]string{`entry 0 ("a")`, `"privileges"`}, 0, "privileges"},
		{"entry not an object", `[{"name": "a", "sha256": "` + h1 + `", "privileges": ["runs:read"]}, 7]`,
			[]string{"entry 1"}, 1, ""},
		{"missing name", `[{"sha256": "` + h1 + `", "privileges": ["runs:read"]}]`,
			[]string{"entry 0", `field "name"`, "missing"}, 0, "name"},
		{"bad name", `[{"name": "a b", "sha256": "` + h1 + `", "privileges": ["runs:read"]}]`,
			[]string{`entry 0 ("a b")`, `field "name"`}, 0, "name"},
		{"short hash", `[{"name": "a", "sha256": "abc", "privileges": ["runs:read"]}]`,
			[]string{`entry 0 ("a")`, `field "sha256"`, "64 hex digits"}, 0, "sha256"},
		{"not hex", `[{"name": "a", "sha256": "` + strings.Repeat("g", 64) + `", "privileges": ["runs:read"]}]`,
			[]string{`entry 0 ("a")`, `field "sha256"`, "not hex"}, 0, "sha256"},
		{"hash of empty", `[{"name": "a", "sha256": "` + HashSecret("") + `", "privileges": ["runs:read"]}]`,
			[]string{`field "sha256"`, "empty secret"}, 0, "sha256"},
		{"bad tenant", `[{"name": "a", "sha256": "` + h1 + `", "privileges": ["runs:read"]},
			{"name": "b", "sha256": "` + h2 + `", "tenant": "acme.eu", "privileges": ["runs:read"]}]`,
			[]string{`entry 1 ("b")`, `field "tenant"`, "acme.eu"}, 1, "tenant"},
		{"long tenant", `[{"name": "a", "sha256": "` + h1 + `", "tenant": "` + strings.Repeat("t", 65) + `", "privileges": ["runs:read"]}]`,
			[]string{`field "tenant"`, "limit is 64"}, 0, "tenant"},
		{"no privileges", `[{"name": "a", "sha256": "` + h1 + `", "privileges": []}]`,
			[]string{`entry 0 ("a")`, `field "privileges"`, "at least one"}, 0, "privileges"},
		{"absent privileges", `[{"name": "a", "sha256": "` + h1 + `"}]`,
			[]string{`field "privileges"`}, 0, "privileges"},
		{"unknown privilege", `[{"name": "a", "sha256": "` + h1 + `", "privileges": ["runs:read", "runs:write"]}]`,
			[]string{`entry 0 ("a")`, `field "privileges[1]"`, `"runs:write"`}, 0, "privileges[1]"},
		{"privilege twice", `[{"name": "a", "sha256": "` + h1 + `", "privileges": ["runs:read", "runs:read"]}]`,
			[]string{`field "privileges[1]"`, "twice"}, 0, "privileges[1]"},
		{"tenant with config:read", `[{"name": "root", "sha256": "` + h2 + `", "privileges": ["config:read"]},
			{"name": "acme-admin", "sha256": "` + h1 + `", "tenant": "acme", "privileges": ["runs:read", "config:read"]}]`,
			[]string{`entry 1 ("acme-admin")`, `field "privileges[1]"`, `"config:read"`, "administrator", `"acme"`}, 1, "privileges[1]"},
		{"tenant with config:write", `[{"name": "acme-admin", "sha256": "` + h1 + `", "tenant": "acme", "privileges": ["config:write"]}]`,
			[]string{`entry 0 ("acme-admin")`, `"config:write"`}, 0, "privileges[0]"},
		{"duplicate name", `[{"name": "a", "sha256": "` + h1 + `", "privileges": ["runs:read"]},
			{"name": "a", "sha256": "` + h2 + `", "privileges": ["runs:read"]}]`,
			[]string{`entry 1 ("a")`, `field "name"`, "duplicate", "entry 0"}, 1, "name"},
		{"duplicate hash", `[{"name": "a", "sha256": "` + h1 + `", "privileges": ["runs:read"]},
			{"name": "b", "sha256": "` + strings.ToUpper(h1) + `", "privileges": ["runs:start"]}]`,
			[]string{`entry 1 ("b")`, `field "sha256"`, "duplicate", `entry 0 ("a")`}, 1, "sha256"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			set, err := ParseTokens([]byte(c.file))
			require.Error(t, err)
			require.Nil(t, set)
			for _, w := range c.want {
				require.Contains(t, err.Error(), w)
			}
			var ee *EntryError
			if c.idx < 0 {
				require.False(t, errors.As(err, &ee))
				return
			}
			require.ErrorAs(t, err, &ee)
			require.Equal(t, c.idx, ee.Index)
			require.Equal(t, c.fld, ee.Field)
		})
	}
}

func TestLoadTokensNamesThePath(t *testing.T) {
	t.Parallel()
	_, err := LoadTokens("testdata/missing.json")
	require.ErrorIs(t, err, os.ErrNotExist)
	require.Contains(t, err.Error(), "testdata/missing.json")

	path := writeFile(t, t.TempDir(), `[{"name": "x"}]`)
	_, err = LoadTokens(path)
	require.Error(t, err)
	require.Contains(t, err.Error(), path)
	require.Contains(t, err.Error(), `entry 0 ("x")`)
}

func TestTokensAccessors(t *testing.T) {
	t.Parallel()
	set, err := ParseTokens([]byte(`[{"name": "a", "sha256": "` + strings.ToUpper(HashSecret("x")) + `", "tenant": "t", "privileges": ["runs:read"]}]`))
	require.NoError(t, err)
	toks := set.Tokens()
	require.Len(t, toks, 1)
	require.Equal(t, HashSecret("x"), toks[0].SHA256(), "normalised to lower case")
	require.False(t, toks[0].Admin())
	toks[0].Name = "changed"
	require.Equal(t, "a", set.Tokens()[0].Name, "Tokens returns a copy")
	ts := set.Tenants()
	ts[0] = "changed"
	require.Equal(t, []string{"t"}, set.Tenants(), "Tenants returns a copy")
}
