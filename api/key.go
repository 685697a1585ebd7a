package api

import (
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/kvpool/kvpool/api/wire"
)

const (
	// MaxKeyBytes is the longest block key, in bytes.
	MaxKeyBytes = 128
	// MaxNameBytes is the longest tenant or namespace name, in bytes.
	MaxNameBytes = 64
)

// BlockKey names a block: Tenant is the unit of isolation and quota,
// Namespace names what makes KV bytes compatible (model, revision, dtype,
// layout, TP rank) and Key is opaque bytes, normally a prefix-chain hash.
type BlockKey struct {
	Tenant    string
	Namespace string
	Key       []byte
}

// String formats the key for logs and errors: tenant/namespace/hex(key).
func (k BlockKey) String() string {
	return k.Tenant + "/" + k.Namespace + "/" + hex.EncodeToString(k.Key)
}

// Validate reports every problem with k, wrapped in ErrInvalidArgument.
func (k BlockKey) Validate() error {
	return errors.Join(ValidateName("tenant", k.Tenant), ValidateName("namespace", k.Namespace), ValidateKey(k.Key))
}

// ValidateKey checks that key has 1 to MaxKeyBytes bytes.
func ValidateKey(key []byte) error {
	switch {
	case len(key) == 0:
		return fmt.Errorf("%w: key is empty", ErrInvalidArgument)
	case len(key) > MaxKeyBytes:
		return fmt.Errorf("%w: key has %d bytes, more than %d", ErrInvalidArgument, len(key), MaxKeyBytes)
	}
	return nil
}

// ValidateChain checks a chain's tenant, namespace and keys (a Fetch, a
// Route, a Plan): at most wire.MaxChainKeys keys, each valid. An empty
// chain checks the names alone.
func ValidateChain(tenant, namespace string, keys [][]byte) error {
	if len(keys) > wire.MaxChainKeys {
		return Errorf(ErrInvalidArgument, "pool: chain of %d keys; at most %d", len(keys), wire.MaxChainKeys)
	}
	t, ns := []byte(tenant), []byte(namespace)
	for _, k := range keys {
		if err := ValidateKeyBytes(t, ns, k); err != nil {
			return err
		}
	}
	if len(keys) == 0 {
		return ValidateKeyBytes(t, ns, []byte("x"))
	}
	return nil
}

// ValidateKeyBytes checks a block's tenant, namespace and key as they
// arrive off the wire, without allocating when they are valid (the node's
// hot path); the error is ValidateName's or ValidateKey's.
func ValidateKeyBytes(tenant, namespace, key []byte) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	if !validName(tenant) {
		return ValidateName("tenant", string(tenant))
	}
	if !validName(namespace) {
		return ValidateName("namespace", string(namespace))
	}
	return nil
}

func validName(b []byte) bool {
	if len(b) == 0 || len(b) > MaxNameBytes {
		return false
	}
	for _, c := range b {
		if !nameChar(c) {
			return false
		}
	}
	return true
}

// ValidateName checks a tenant or namespace name: 1 to MaxNameBytes
// characters from [A-Za-z0-9._-]. kind names the field in the error.
func ValidateName(kind, name string) error {
	if name == "" {
		return fmt.Errorf("%w: %s is empty", ErrInvalidArgument, kind)
	}
	if len(name) > MaxNameBytes {
		return fmt.Errorf("%w: %s has %d bytes, more than %d", ErrInvalidArgument, kind, len(name), MaxNameBytes)
	}
	for i := 0; i < len(name); i++ {
		if !nameChar(name[i]) {
			return fmt.Errorf("%w: %s %q has %q at byte %d; allowed are A-Z a-z 0-9 . _ -", ErrInvalidArgument, kind, name, name[i], i)
		}
	}
	return nil
}

func nameChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
}
