package api

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
)

// ChainScheme selects how prefix-chain keys are hashed.
type ChainScheme int

const (
	chainSchemeInvalid ChainScheme = iota
	// ChainSHA256 is kvpool's own scheme: key_i = SHA-256(key_{i-1} ‖
	// u32le(len(tokens_i)) ‖ tokens_i as u32le ‖ u32le(len(extra_i)) ‖
	// extra_i), with key_{-1} = SHA-256("kvpool/chain/v1" ‖ seed). Extra keys
	// are encoded with canonical CBOR. Its fixed-width token encoding is
	// trivial to reproduce in any language.
	ChainSHA256
	// ChainSHA256CBOR is vLLM's sha256_cbor scheme (prefix_caching_hash_algo
	// = "sha256_cbor"): key_i = SHA-256(CBOR([key_{i-1}, [tokens_i...],
	// extra_i])) with canonical CBOR, where key_{-1} = NONE_HASH =
	// SHA-256(CBOR(seed)) and seed is the engine's PYTHONHASHSEED string.
	// Keys are the 32-byte digests vLLM uses as BlockHash (before it appends
	// a 4-byte group id).
	ChainSHA256CBOR
)

func (s ChainScheme) String() string {
	switch s {
	case ChainSHA256:
		return "sha256"
	case ChainSHA256CBOR:
		return "sha256_cbor"
	}
	return fmt.Sprintf("ChainScheme(%d)", int(s))
}

// ParseChainScheme maps "sha256" and "sha256_cbor" to their schemes.
func ParseChainScheme(s string) (ChainScheme, error) {
	switch s {
	case "sha256":
		return ChainSHA256, nil
	case "sha256_cbor":
		return ChainSHA256CBOR, nil
	}
	return chainSchemeInvalid, fmt.Errorf("%w: unknown chain scheme %q (want sha256 or sha256_cbor)", ErrInvalidArgument, s)
}

// ChainConfig says how to cut a prompt into blocks and hash them.
type ChainConfig struct {
	// Scheme is the hash scheme. Required.
	Scheme ChainScheme
	// BlockTokens is the number of tokens per block (vLLM's block_size,
	// default 16 there). Required, > 0. A trailing partial block gets no key,
	// as in vLLM.
	BlockTokens int
	// Seed roots the chain: for ChainSHA256CBOR it is the PYTHONHASHSEED
	// string the engine runs with. Engines that must share keys use the
	// same seed.
	Seed string
	// Extra, when set, returns the extra keys of block i (LoRA name,
	// multimodal hashes, cache salt); nil means none. For ChainSHA256CBOR
	// the value is encoded as vLLM encodes its extra_keys tuple: nil is
	// None, []any is a tuple of strings, integers, bytes or nested tuples.
	Extra func(block int) []any
}

// ChainKeys cuts tokens into full blocks of cfg.BlockTokens and returns one
// key per block, block 0 first. Each key names its whole prefix, so the
// longest prefix a node holds is the length of the longest run of leading
// keys it has.
func ChainKeys(cfg ChainConfig, tokens []uint32) ([][]byte, error) {
	if cfg.BlockTokens <= 0 {
		return nil, fmt.Errorf("%w: block tokens %d must be positive", ErrInvalidArgument, cfg.BlockTokens)
	}
	n := len(tokens) / cfg.BlockTokens
	keys := make([][]byte, 0, n)
	parent, err := chainRoot(cfg)
	if err != nil {
		return nil, err
	}
	var scratch []byte
	for i := 0; i < n; i++ {
		block := tokens[i*cfg.BlockTokens : (i+1)*cfg.BlockTokens]
		var extra []any
		if cfg.Extra != nil {
			extra = cfg.Extra(i)
		}
		var sum [sha256.Size]byte
		switch cfg.Scheme {
		case ChainSHA256CBOR:
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
		case ChainSHA256:
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
func chainRoot(cfg ChainConfig) ([]byte, error) {
	switch cfg.Scheme {
	case ChainSHA256CBOR:
		enc, _ := appendCBOR(nil, cfg.Seed)
		sum := sha256.Sum256(enc)
		return sum[:], nil
	case ChainSHA256:
		sum := sha256.Sum256(append([]byte("kvpool/chain/v1"), cfg.Seed...))
		return sum[:], nil
	}
	return nil, fmt.Errorf("%w: chain scheme %v", ErrInvalidArgument, cfg.Scheme)
}
