package auth

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/kvpool/kvpool/api"
)

// TokenPrefix starts every token NewToken makes, so a token in a log or a
// config file is recognisable (and secret scanners can find it).
const TokenPrefix = "kvp_"

// NewToken returns a new bearer token (256 random bits) and the line of a
// token file that grants it to id. Only the line is kept by the node: it
// holds the token's SHA-256, not the token.
func NewToken(name string, id Identity, expires time.Time) (token, line string, err error) {
	if err := checkTokenName(name); err != nil {
		return "", "", err
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", err
	}
	token = TokenPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	sum := sha256.Sum256([]byte(token))
	line = fmt.Sprintf("%s %s sha256:%s", name, identityField(id), hex.EncodeToString(sum[:]))
	if !expires.IsZero() {
		line += " " + expires.UTC().Format(time.RFC3339)
	}
	return token, line, nil
}

// identityField is how a token file names an identity: tenant:NAME,
// node:ID or admin.
func identityField(id Identity) string {
	switch id.Role {
	case RoleTenant:
		return "tenant:" + id.Tenant
	case RoleNode:
		return "node:" + id.Name
	}
	return "admin"
}

func checkTokenName(name string) error {
	if err := api.ValidateName("token name", name); err != nil {
		return err
	}
	return nil
}

// token is one line of a token file.
type token struct {
	id      Identity
	sum     [sha256.Size]byte
	expires time.Time // zero: never
}

// Tokens is a parsed token file: which token hash grants which identity,
// until when. Safe for concurrent reads; a reload builds a new one.
type Tokens struct {
	byHash map[[sha256.Size]byte]token
}

// ParseTokens reads a token file. Each line that is not blank or a
// comment (#) is
//
//	NAME IDENTITY sha256:HEX [EXPIRES]
//
// NAME names the credential in logs ([A-Za-z0-9._-]); IDENTITY is
// tenant:TENANT, node:NODE-ID or admin; HEX is the SHA-256 of the token
// (64 hex digits, as NewToken writes it); EXPIRES, optional, is an
// RFC 3339 time after which the token stops working. Every problem is
// reported, with its line number.
func ParseTokens(r io.Reader) (*Tokens, error) {
	t := &Tokens{byHash: map[[sha256.Size]byte]token{}}
	names := map[string]int{}
	var errs []error
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 64<<10)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		tok, name, err := parseTokenLine(line)
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d: %w", n, err))
			continue
		}
		if prev, dup := names[name]; dup {
			errs = append(errs, fmt.Errorf("line %d: token name %q is already used on line %d", n, name, prev))
			continue
		}
		if _, dup := t.byHash[tok.sum]; dup {
			errs = append(errs, fmt.Errorf("line %d: the same token hash is granted twice", n))
			continue
		}
		names[name] = n
		t.byHash[tok.sum] = tok
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%w: token file: %w", api.ErrInvalidArgument, err)
	}
	return t, nil
}

func parseTokenLine(line string) (token, string, error) {
	f := strings.Fields(line)
	if len(f) < 3 || len(f) > 4 {
		return token{}, "", fmt.Errorf("want NAME IDENTITY sha256:HEX [EXPIRES], got %d fields", len(f))
	}
	name := f[0]
	if err := checkTokenName(name); err != nil {
		return token{}, "", err
	}
	id, err := parseIdentityField(f[1])
	if err != nil {
		return token{}, "", err
	}
	if id.Role != RoleNode { // a node is named by its id
		id.Name = name
	}
	hexSum, ok := strings.CutPrefix(f[2], "sha256:")
	if !ok {
		return token{}, "", fmt.Errorf("hash %q: want sha256:HEX", f[2])
	}
	var tok token
	if b, err := hex.DecodeString(hexSum); err != nil || len(b) != sha256.Size {
		return token{}, "", fmt.Errorf("hash %q: want 64 hex digits", f[2])
	} else {
		copy(tok.sum[:], b)
	}
	tok.id = id
	if len(f) == 4 {
		if tok.expires, err = time.Parse(time.RFC3339, f[3]); err != nil {
			return token{}, "", fmt.Errorf("expiry %q: want an RFC 3339 time such as 2027-01-31T00:00:00Z", f[3])
		}
	}
	return tok, name, nil
}

func parseIdentityField(s string) (Identity, error) {
	if s == "admin" {
		return Identity{Role: RoleAdmin}, nil
	}
	kind, name, ok := strings.Cut(s, ":")
	switch {
	case ok && kind == "tenant":
		if err := api.ValidateName("tenant", name); err != nil {
			return Identity{}, err
		}
		return Identity{Role: RoleTenant, Tenant: name}, nil
	case ok && kind == "node":
		if err := api.ValidateName("node id", name); err != nil {
			return Identity{}, err
		}
		return Identity{Role: RoleNode, Name: name}, nil
	}
	return Identity{}, fmt.Errorf("identity %q: want tenant:NAME, node:ID or admin", s)
}

// Len is how many tokens t grants.
func (t *Tokens) Len() int { return len(t.byHash) }

// Verify returns the identity bearer grants at now, or an error wrapping
// api.ErrUnauthenticated for a token that is unknown or expired. It never
// says which.
func (t *Tokens) Verify(bearer string, now time.Time) (Identity, error) {
	sum := sha256.Sum256([]byte(bearer))
	tok, ok := t.byHash[sum]
	// NB: the map finds the entry by the hash of the token, which says
	// nothing useful about the token; the compare below is constant-time
	// for form's sake.
	if !ok || subtle.ConstantTimeCompare(tok.sum[:], sum[:]) != 1 {
		return Identity{}, fmt.Errorf("%w: unknown or expired token", api.ErrUnauthenticated)
	}
	if !tok.expires.IsZero() && !now.Before(tok.expires) {
		return Identity{}, fmt.Errorf("%w: unknown or expired token", api.ErrUnauthenticated)
	}
	return tok.id, nil
}
