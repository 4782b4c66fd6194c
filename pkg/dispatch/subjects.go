package dispatch

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// DefaultPrefix is the first token of every Harvest subject.
const DefaultPrefix = "harvest"

const hexDigits = "0123456789ABCDEF"

func safeByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// EncodeToken turns any name into one subject token. An empty name encodes to
// "%", which no non-empty name produces, so the token is never empty.
func EncodeToken(name string) string {
	if name == "" {
		return "%"
	}
	n := 0
	for i := 0; i < len(name); i++ {
		if !safeByte(name[i]) {
			n++
		}
	}
	if n == 0 {
		return name
	}
	var b strings.Builder
	b.Grow(len(name) + 2*n)
	for i := 0; i < len(name); i++ {
		c := name[i]
		if safeByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&0x0F])
	}
	return b.String()
}

// ErrBadToken reports a subject token that EncodeToken could not have made.
var ErrBadToken = errors.New("dispatch: malformed subject token")

// DecodeToken reverses EncodeToken. Only the exact output of EncodeToken is
// accepted (upper-case hex, escapes only where needed), so each name has one
// token and each token one name.
func DecodeToken(tok string) (string, error) {
	if tok == "%" {
		return "", nil
	}
	if tok == "" {
		return "", fmt.Errorf("%w: empty", ErrBadToken)
	}
	var b strings.Builder
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if safeByte(c) {
			b.WriteByte(c)
			continue
		}
		if c != '%' || i+2 >= len(tok) {
			return "", fmt.Errorf("%w: %q at byte %d", ErrBadToken, tok, i)
		}
		hi, lo := strings.IndexByte(hexDigits, tok[i+1]), strings.IndexByte(hexDigits, tok[i+2])
		if hi < 0 || lo < 0 {
			return "", fmt.Errorf("%w: %q: bad escape at byte %d", ErrBadToken, tok, i)
		}
		v := byte(hi<<4 | lo)
		if safeByte(v) {
			return "", fmt.Errorf("%w: %q: %q must not be escaped", ErrBadToken, tok, v)
		}
		b.WriteByte(v)
		i += 2
	}
	return b.String(), nil
}

// Subjects builds the subjects of one Harvest installation.
type Subjects struct {
	// Prefix is the first token; DefaultPrefix when empty.
	Prefix string
}

func (s Subjects) p() string {
	if s.Prefix == "" {
		return DefaultPrefix
	}
	return s.Prefix
}

// Start is where a tenant requests one start. Tenant names are restricted to
// safe characters when registered, so they are used as they are.
func (s Subjects) Start(tenant string) string { return s.p() + ".start." + tenant }

// StartBatch is where a tenant requests a batch of starts.
func (s Subjects) StartBatch(tenant string) string { return s.p() + ".start_batch." + tenant }

// StartAll matches the start subjects of every tenant (for gateways).
func (s Subjects) StartAll() string { return s.p() + ".start.*" }

// StartBatchAll matches the batch-start subjects of every tenant.
func (s Subjects) StartBatchAll() string { return s.p() + ".start_batch.*" }

// Wake hints the workers of a shard that a queue may have work.
func (s Subjects) Wake(shard int, queue string) string {
	return s.p() + ".wake." + strconv.Itoa(shard) + "." + EncodeToken(queue)
}

// Dispatch names a task row for one worker of the queue group to claim.
func (s Subjects) Dispatch(shard int, queue string) string {
	return s.p() + ".dispatch." + strconv.Itoa(shard) + "." + EncodeToken(queue)
}

// Weights announces a changed weight override or quota of a queue.
func (s Subjects) Weights(queue string) string { return s.p() + ".weights." + EncodeToken(queue) }

// WeightsAll matches the weight events of every queue.
func (s Subjects) WeightsAll() string { return s.p() + ".weights.*" }

// Runs announces that a run reached a final state.
func (s Subjects) Runs(tenant, runID string) string {
	return s.p() + ".runs." + tenant + "." + EncodeToken(runID)
}

// RunsOf matches the run events of every run of tenant.
func (s Subjects) RunsOf(tenant string) string { return s.p() + ".runs." + tenant + ".>" }

// Admission announces a change of the admission configuration. The message
// is a hint only: a gateway that gets it re-reads shard 0.
func (s Subjects) Admission() string { return s.p() + ".admission" }

// Tenants announces that a tenant's entry in the directory of homes
// changed (a placement, a pin, a step of a move). Like Admission, the
// message is a hint: a gateway that gets it re-reads the entry on shard 0.
func (s Subjects) Tenants() string { return s.p() + ".tenants" }

// Handle is where the stock worker asks users' services to run a workflow.
func (s Subjects) Handle(workflow string) string { return s.p() + ".handle." + EncodeToken(workflow) }
