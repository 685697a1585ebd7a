// Package chain computes prefix-chain block keys: a prompt cut into blocks
// of B tokens, key_i = H(key_{i-1} ‖ tokens_i ‖ extra_i), so each key names
// its whole prefix. SHA256CBOR reproduces vLLM's sha256_cbor scheme (the
// test vectors were computed with Python's cbor2 and hashlib); SHA256 is
// kvpool's own fixed-width encoding.
package chain

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/kvpool/kvpool/api"
)

// Scheme selects how prefix-chain keys are hashed.
type Scheme int

const (
	schemeInvalid Scheme = iota
	// SHA256 is kvpool's own scheme: key_i = SHA-256(key_{i-1} ‖
	// u32le(len(tokens_i)) ‖ tokens_i as u32le ‖ u32le(len(extra_i)) ‖
	// extra_i), with key_{-1} = SHA-256("kvpool/chain/v1" ‖ seed). Extra keys
	// are encoded with canonical CBOR. Its fixed-width token encoding is
	// trivial to reproduce in any language.
	SHA256
	// SHA256CBOR is vLLM's sha256_cbor scheme (prefix_caching_hash_algo
	// = "sha256_cbor"): key_i = SHA-256(CBOR([key_{i-1}, [tokens_i...],
	// extra_i])) with canonical CBOR, where key_{-1} = NONE_HASH =
	// SHA-256(CBOR(seed)) and seed is the engine's PYTHONHASHSEED string.
	// Keys are the 32-byte digests vLLM uses as BlockHash (before it appends
	// a 4-byte group id).
	SHA256CBOR
)

func (s Scheme) String() string {
	switch s {
	case SHA256:
		return "sha256"
	case SHA256CBOR:
		return "sha256_cbor"
	}
	return fmt.Sprintf("Scheme(%d)", int(s))
}

// ParseScheme maps "sha256" and "sha256_cbor" to their schemes.
func ParseScheme(s string) (Scheme, error) {
	switch s {
	case "sha256":
		return SHA256, nil
	case "sha256_cbor":
		return SHA256CBOR, nil
	}
	return schemeInvalid, fmt.Errorf("%w: unknown chain scheme %q (want sha256 or sha256_cbor)", api.ErrInvalidArgument, s)
}

// Config says how to cut a prompt into blocks and hash them.
type Config struct {
	// Scheme is the hash scheme. Required.
	Scheme Scheme
	// BlockTokens is the number of tokens per block (vLLM's block_size,
	// default 16 there). Required, > 0. A trailing partial block gets no key,
	// as in vLLM.
	BlockTokens int
	// Seed roots the chain: for SHA256CBOR it is the PYTHONHASHSEED
	// string the engine runs with. Engines that must share keys use the
	// same seed.
	Seed string
	// Extra, when set, returns the extra keys of block i (LoRA name,
	// multimodal hashes, cache salt); nil means none. For SHA256CBOR
	// the value is encoded as vLLM encodes its extra_keys tuple: nil is
	// None, []any is a tuple of strings, integers, bytes or nested tuples.
	Extra func(block int) []any
}

// Keys cuts tokens into full blocks of cfg.BlockTokens and returns one
// key per block, block 0 first. Each key names its whole prefix, so the
// longest prefix a node holds is the length of the longest run of leading
// keys it has.
func Keys(cfg Config, tokens []uint32) ([][]byte, error) { return KeysAfter(cfg, nil, tokens) }

// KeysAfter is Keys for blocks that continue a chain after the block
// whose key is parent (nil: from the chain's root, as Keys): what an
// engine's event for blocks stored under a known parent needs. Extra's
// block index counts from the first of these blocks.
func KeysAfter(cfg Config, parent []byte, tokens []uint32) ([][]byte, error) {
	if cfg.BlockTokens <= 0 {
		return nil, fmt.Errorf("%w: block tokens %d must be positive", api.ErrInvalidArgument, cfg.BlockTokens)
	}
	n := len(tokens) / cfg.BlockTokens
	keys := make([][]byte, 0, n)
	if parent == nil {
		root, err := chainRoot(cfg)
		if err != nil {
			return nil, err
		}
		parent = root
	} else if cfg.Scheme != SHA256 && cfg.Scheme != SHA256CBOR {
		return nil, fmt.Errorf("%w: chain scheme %v", api.ErrInvalidArgument, cfg.Scheme)
	}
	var err error
	var scratch []byte
	for i := 0; i < n; i++ {
		block := tokens[i*cfg.BlockTokens : (i+1)*cfg.BlockTokens]
		var extra []any
		if cfg.Extra != nil {
			extra = cfg.Extra(i)
		}
		var sum [sha256.Size]byte
		switch cfg.Scheme {
		case SHA256CBOR:
			scratch = appendCBORHead(scratch[:0], 4, 3)
			scratch = append(appendCBORHead(scratch, 2, uint64(len(parent))), parent...)
			scratch = appendCBORHead(scratch, 4, uint64(len(block)))
			for _, t := range block {
				scratch = appendCBORHead(scratch, 0, uint64(t))
			}
			if extra == nil {
				scratch = append(scratch, 0xf6)
			} else if scratch, err = appendCBOR(scratch, extra); err != nil {
				return nil, err
			}
			sum = sha256.Sum256(scratch)
		case SHA256:
			scratch = append(scratch[:0], parent...)
			scratch = binary.LittleEndian.AppendUint32(scratch, uint32(len(block)))
			for _, t := range block {
				scratch = binary.LittleEndian.AppendUint32(scratch, t)
			}
			var enc []byte
			if extra != nil {
				if enc, err = appendCBOR(nil, extra); err != nil {
					return nil, err
				}
			}
			scratch = binary.LittleEndian.AppendUint32(scratch, uint32(len(enc)))
			scratch = append(scratch, enc...)
			sum = sha256.Sum256(scratch)
		}
		key := sum[:]
		keys = append(keys, key)
		parent = key
	}
	return keys, nil
}

// chainRoot is key_{-1}, the parent of block 0.
func chainRoot(cfg Config) ([]byte, error) {
	switch cfg.Scheme {
	case SHA256CBOR:
		enc, _ := appendCBOR(nil, cfg.Seed)
		sum := sha256.Sum256(enc)
		return sum[:], nil
	case SHA256:
		sum := sha256.Sum256(append([]byte("kvpool/chain/v1"), cfg.Seed...))
		return sum[:], nil
	}
	return nil, fmt.Errorf("%w: chain scheme %v", api.ErrInvalidArgument, cfg.Scheme)
}

// ReadTokens reads a prompt's token ids: non-negative 32-bit integers
// separated by spaces, commas or newlines.
func ReadTokens(r io.Reader) ([]uint32, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	fields := strings.FieldsFunc(string(b), func(c rune) bool { return c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r' })
	out := make([]uint32, 0, len(fields))
	for _, s := range fields {
		v, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%w: token %q is not a non-negative 32-bit integer", api.ErrInvalidArgument, s)
		}
		out = append(out, uint32(v))
	}
	return out, nil
}
