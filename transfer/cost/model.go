package cost

import (
	"errors"
	"fmt"
	"math"
	"regexp"
)

// Model is a model's KV-cache shape, from which KVBytesPerToken follows.
// Three forms: standard attention (Layers × 2 × KVHeads × HeadDim),
// multi-head latent attention (Layers × (LatentDim + RopeDim), K and V
// share the latent), or an explicit byte count. Sparse attention keeps
// only KeptFraction of the tokens' KV.
type Model struct {
	// Name identifies the profile ("llama3-8b"). Required.
	Name string `json:"name"`
	// Layers is the number of decoder layers holding KV.
	Layers int `json:"layers"`
	// KVHeads and HeadDim shape standard (MHA/GQA/MQA) attention.
	KVHeads int `json:"kv_heads,omitempty"`
	HeadDim int `json:"head_dim,omitempty"`
	// LatentDim and RopeDim shape MLA: per layer and token the cache holds
	// one latent vector and one decoupled RoPE key.
	LatentDim int `json:"latent_dim,omitempty"`
	RopeDim   int `json:"rope_dim,omitempty"`
	// DTypeBytes is the size of one cached element. Default 2 (bf16).
	DTypeBytes int `json:"dtype_bytes,omitempty"`
	// KeptFraction, in (0, 1], is the share of tokens whose KV sparse
	// attention keeps. Default 1.
	KeptFraction float64 `json:"kept_fraction,omitempty"`
	// KVBytesPerToken, when set, overrides the shape.
	KVBytes float64 `json:"kv_bytes_per_token,omitempty"`
}

var profileName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// Validate reports every problem with m.
func (m Model) Validate() error {
	var errs []error
	if !profileName.MatchString(m.Name) {
		errs = append(errs, fmt.Errorf("model %q: name must be 1-64 of [a-z0-9._-], starting with a letter or digit", m.Name))
	}
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("model %q: "+format, append([]any{m.Name}, args...)...))
	}
	if m.KVBytes != 0 {
		if !(m.KVBytes > 0) || math.IsInf(m.KVBytes, 0) {
			bad("kv_bytes_per_token %v must be a positive number", m.KVBytes)
		}
	} else {
		if m.Layers <= 0 {
			bad("layers %d must be positive (or give kv_bytes_per_token)", m.Layers)
		}
		std, mla := m.KVHeads != 0 || m.HeadDim != 0, m.LatentDim != 0 || m.RopeDim != 0
		switch {
		case std && mla:
			bad("give kv_heads and head_dim, or latent_dim and rope_dim, not both")
		case std:
			if m.KVHeads <= 0 || m.HeadDim <= 0 {
				bad("kv_heads %d and head_dim %d must both be positive", m.KVHeads, m.HeadDim)
			}
		case mla:
			if m.LatentDim <= 0 || m.RopeDim < 0 {
				bad("latent_dim %d must be positive and rope_dim %d non-negative", m.LatentDim, m.RopeDim)
			}
		default:
			bad("no KV shape: give kv_heads and head_dim, latent_dim and rope_dim, or kv_bytes_per_token")
		}
		switch m.DTypeBytes {
		case 0, 1, 2, 4:
		default:
			bad("dtype_bytes %d must be 1, 2 or 4", m.DTypeBytes)
		}
	}
	if m.KeptFraction != 0 && !(m.KeptFraction > 0 && m.KeptFraction <= 1) {
		bad("kept_fraction %v must be in (0, 1]", m.KeptFraction)
	}
	return errors.Join(errs...)
}

// KVBytesPerToken is how many bytes of KV cache one token takes across
// all layers.
func (m Model) KVBytesPerToken() float64 {
	kept := m.KeptFraction
	if kept == 0 {
		kept = 1
	}
	if m.KVBytes != 0 {
		return m.KVBytes * kept
	}
	dtype := m.DTypeBytes
	if dtype == 0 {
		dtype = 2
	}
	perLayer := 2 * m.KVHeads * m.HeadDim
	if m.LatentDim != 0 {
		perLayer = m.LatentDim + m.RopeDim
	}
	return float64(m.Layers*perLayer*dtype) * kept
}

// BuiltinModels are the profiles every daemon and the CLI know.
func BuiltinModels() []Model {
	return []Model{
		{Name: "llama3-8b", Layers: 32, KVHeads: 8, HeadDim: 128},
		{Name: "llama3-70b", Layers: 80, KVHeads: 8, HeadDim: 128},
		{Name: "llama3-405b", Layers: 126, KVHeads: 8, HeadDim: 128},
		{Name: "qwen2.5-7b", Layers: 28, KVHeads: 4, HeadDim: 128},
		{Name: "deepseek-v3", Layers: 61, LatentDim: 512, RopeDim: 64},
	}
}
