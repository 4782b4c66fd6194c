package auth

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

// MaxTenantLen is the longest tenant name allowed.
const MaxTenantLen = 64

// MaxNameLen is the longest token name allowed.
const MaxNameLen = 128

// ValidateTenant checks a tenant name: 1 to MaxTenantLen characters, each
// an ASCII letter, a digit, '_' or '-'. Such a name is safe as one NATS
// subject token, in a URL path and in a log line.
func ValidateTenant(name string) error {
	if name == "" {
		return errors.New("tenant name is empty")
	}
	if len(name) > MaxTenantLen {
		return fmt.Errorf("tenant name is %d characters long, the limit is %d", len(name), MaxTenantLen)
	}
	for i := 0; i < len(name); i++ {
		if !tenantByte(name[i]) {
			return fmt.Errorf("tenant name %q has %q at byte %d; only A-Z, a-z, 0-9, '_' and '-' are allowed", name, name[i], i)
		}
	}
	return nil
}

func tenantByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

func nameByte(c byte) bool { return tenantByte(c) || c == '.' || c == '@' }

func validateName(name string) error {
	if name == "" {
		return errors.New("missing (every token needs a name)")
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("%d characters long, the limit is %d", len(name), MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		if !nameByte(name[i]) {
			return fmt.Errorf("%q at byte %d; only A-Z, a-z, 0-9, '_', '-', '.' and '@' are allowed", name[i], i)
		}
	}
	return nil
}

// emptyHash is the SHA-256 of the empty string: a file naming it surely
// hashed the wrong thing.
var emptyHash = sha256.Sum256(nil)

// Token is one validated entry of a tokens file. It never holds the
// secret, only its SHA-256.
type Token struct {
	// Name identifies the token in logs and audit rows.
	Name string
	// Tenant is the tenant the token acts for; empty for an administrator.
	Tenant string
	// Privileges are what the token may do.
	Privileges Privileges

	hash [sha256.Size]byte
}

// Admin reports whether the token belongs to no tenant.
func (t Token) Admin() bool { return t.Tenant == "" }

// SHA256 returns the lower-case hex SHA-256 of the token's secret.
func (t Token) SHA256() string { return hex.EncodeToString(t.hash[:]) }

// EntryError reports a tokens file entry that was refused.
type EntryError struct {
	// Index is the entry's position in the file's list, from 0.
	Index int
	// Name is the entry's name when it could be read.
	Name string
	// Field is the JSON field at fault; empty when the entry as a whole is.
	Field string
	// Err says what is wrong.
	Err error
}

// Error names the entry, the field and the fault.
func (e *EntryError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "entry %d", e.Index)
	if e.Name != "" {
		fmt.Fprintf(&b, " (%q)", e.Name)
	}
	if e.Field != "" {
		fmt.Fprintf(&b, ": field %q", e.Field)
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

// Unwrap returns the underlying fault.
func (e *EntryError) Unwrap() error { return e.Err }

// TokenSet is an immutable, validated set of tokens, as read from one
// version of a tokens file. It is safe for concurrent use.
type TokenSet struct {
	tokens  []Token
	byHash  map[[sha256.Size]byte]int
	tenants []string
	digest  [sha256.Size]byte // of the bytes the set was parsed from
}

// FileEntry is the JSON form of one token in a tokens file, for programs
// that write one (benchmarks, test fleets). SHA256 is HashSecret of the
// secret; Tenant is empty for an administrator.
type FileEntry struct {
	Name       string   `json:"name"`
	SHA256     string   `json:"sha256"`
	Tenant     string   `json:"tenant,omitempty"`
	Privileges []string `json:"privileges"`
}

// ParseTokens reads a tokens file's content (see the package documentation
// for the format). The whole file is refused when any entry is bad; the
// error then names the entry (its index and name) and the field.
func ParseTokens(data []byte) (*TokenSet, error) {
	var raws []json.RawMessage
	if err := json.Unmarshal(data, &raws); err != nil {
		return nil, fmt.Errorf("tokens file must be a JSON array of token entries: %w", err)
	}
	if raws == nil {
		return nil, errors.New("tokens file must be a JSON array of token entries, not null")
	}
	set := &TokenSet{
		tokens: make([]Token, 0, len(raws)),
		byHash: make(map[[sha256.Size]byte]int, len(raws)),
		digest: sha256.Sum256(data),
	}
	byName := make(map[string]int, len(raws))
	tenants := make(map[string]bool)
	for i, raw := range raws {
		tok, err := parseEntry(i, raw)
		if err != nil {
			return nil, err
		}
		if j, dup := byName[tok.Name]; dup {
			return nil, &EntryError{Index: i, Name: tok.Name, Field: "name",
				Err: fmt.Errorf("duplicate name: entry %d has the same name", j)}
		}
		if j, dup := set.byHash[tok.hash]; dup {
			return nil, &EntryError{Index: i, Name: tok.Name, Field: "sha256",
				Err: fmt.Errorf("duplicate hash: entry %d (%q) has the same secret", j, set.tokens[j].Name)}
		}
		byName[tok.Name] = i
		set.byHash[tok.hash] = i
		set.tokens = append(set.tokens, tok)
		if tok.Tenant != "" && !tenants[tok.Tenant] {
			tenants[tok.Tenant] = true
			set.tenants = append(set.tenants, tok.Tenant)
		}
	}
	slices.Sort(set.tenants)
	return set, nil
}

func parseEntry(i int, raw json.RawMessage) (Token, error) {
	var e FileEntry
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		ee := &EntryError{Index: i, Err: err}
		var lenient struct {
			Name string `json:"name"`
		}
		if json.Unmarshal(raw, &lenient) == nil {
			ee.Name = lenient.Name
		}
		var typeErr *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typeErr):
			ee.Field = typeErr.Field
			ee.Err = fmt.Errorf("wrong JSON type: found %s, want %s", typeErr.Value, typeErr.Type)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			ee.Field = strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			ee.Err = errors.New("unknown field (known: name, sha256, tenant, privileges)")
		}
		return Token{}, ee
	}
	fail := func(field string, err error) (Token, error) {
		return Token{}, &EntryError{Index: i, Name: e.Name, Field: field, Err: err}
	}
	if err := validateName(e.Name); err != nil {
		return fail("name", err)
	}
	tok := Token{Name: e.Name, Tenant: e.Tenant}

	if len(e.SHA256) != 2*sha256.Size {
		return fail("sha256", fmt.Errorf("want %d hex digits (the SHA-256 of the secret), found %d characters", 2*sha256.Size, len(e.SHA256)))
	}
	if _, err := hex.Decode(tok.hash[:], []byte(e.SHA256)); err != nil {
		return fail("sha256", fmt.Errorf("not hex: %w", err))
	}
	if tok.hash == emptyHash {
		return fail("sha256", errors.New("is the hash of an empty secret"))
	}

	if e.Tenant != "" {
		if err := ValidateTenant(e.Tenant); err != nil {
			return fail("tenant", err)
		}
	}

	if len(e.Privileges) == 0 {
		return fail("privileges", errors.New("empty: a token needs at least one privilege"))
	}
	for k, s := range e.Privileges {
		field := fmt.Sprintf("privileges[%d]", k)
		p, err := ParsePrivilege(s)
		if err != nil {
			return fail(field, err)
		}
		if tok.Privileges.Has(p) {
			return fail(field, fmt.Errorf("%q is listed twice", s))
		}
		if p.AdminOnly() && tok.Tenant != "" {
			return fail(field, fmt.Errorf("%q is for administrator tokens only, and this token is bound to tenant %q", s, tok.Tenant))
		}
		tok.Privileges |= p.bit()
	}
	return tok, nil
}

// LoadTokens reads and parses a tokens file. Errors start with the path.
func LoadTokens(path string) (*TokenSet, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: tokens file: %w", err)
	}
	set, err := ParseTokens(data)
	if err != nil {
		return nil, fmt.Errorf("auth: tokens file %s: %w", path, err)
	}
	return set, nil
}

// Len returns the number of tokens.
func (s *TokenSet) Len() int { return len(s.tokens) }

// Tokens returns the tokens in file order.
func (s *TokenSet) Tokens() []Token { return slices.Clone(s.tokens) }

// Tenants returns the registered tenants: the distinct tenants of the
// tenant-bound tokens, sorted. Administrator tokens add none.
func (s *TokenSet) Tenants() []string { return slices.Clone(s.tenants) }

// Authenticate returns the principal whose secret is bearer, or an error
// that matches ErrUnauthenticated.
//
// The secret is hashed and the hash looked up in a map. The map lookup is
// not constant-time, but what it compares is a SHA-256 of the presented
// secret: a caller cannot choose the hash's bytes, so timing reveals nothing
// useful about any stored hash. The final comparison of the full hashes is
// constant-time.
func (s *TokenSet) Authenticate(bearer string) (Principal, error) {
	if bearer == "" {
		return Principal{}, ErrMissingToken
	}
	if len(bearer) > MaxSecretLen {
		return Principal{}, ErrUnknownToken
	}
	sum := sha256.Sum256([]byte(bearer))
	i, ok := s.byHash[sum]
	if !ok {
		return Principal{}, ErrUnknownToken
	}
	t := s.tokens[i]
	if subtle.ConstantTimeCompare(t.hash[:], sum[:]) != 1 {
		return Principal{}, ErrUnknownToken
	}
	return Principal{Name: t.Name, Tenant: t.Tenant, Privileges: t.Privileges}, nil
}
