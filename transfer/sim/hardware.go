package sim

import (
	"errors"
	"fmt"
	"math"

	"github.com/kvpool/kvpool/transfer/cost"
)

// Hardware is one engine: how many GPUs serve the model together
// (tensor parallel), their memory, and the model's weights on them.
type Hardware struct {
	// GPUs per engine. Prefill and decode scale with them ideally.
	GPUs int
	// HBMBytes and HBMBytesPerSecond are one GPU's memory and its
	// bandwidth.
	HBMBytes, HBMBytesPerSecond float64
	// WeightsBytes is the model's weights across the engine.
	WeightsBytes float64
	// MemoryFraction is the share of memory the engine takes for weights
	// and KV (vLLM's gpu_memory_utilization). Default 0.9.
	MemoryFraction float64
	// HostToGPUBytesPerSecond is the host-to-GPU copy rate of pinned
	// memory, per engine.
	HostToGPUBytesPerSecond float64
}

// H200 is one NVIDIA H200: 141 GB of HBM3e at 4.8 TB/s (NVIDIA's
// figures) and pinned host-to-GPU copies at 54.46 GB/s (512 MiB copies,
// measured: ../shared/anchors/gpu-anchor-h200.json).
var H200 = Hardware{GPUs: 1, HBMBytes: 141e9, HBMBytesPerSecond: 4.8e12, HostToGPUBytesPerSecond: 54.46e9}

// servings are how the built-in models are served on H200s: tensor
// parallel degree and weight bytes (bf16, DeepSeek-V3 in its native fp8).
var servings = map[string]struct {
	gpus    int
	weights float64
}{
	"llama3-8b":         {1, 16.06e9},
	"llama3-8b-sparse8": {1, 16.06e9},
	"qwen2.5-7b":        {1, 15.23e9},
	"llama3-70b":        {2, 141.1e9},
	"llama3-405b":       {8, 811e9},
	"deepseek-v3":       {8, 671e9},
}

// DefaultHardware is how model is served on accelerator by default.
func DefaultHardware(model, accelerator string) (Hardware, error) {
	if accelerator != "h200" {
		return Hardware{}, fmt.Errorf("sim: no hardware profile for accelerator %q (known: h200); give the engine's memory and bandwidths", accelerator)
	}
	s, ok := servings[model]
	if !ok {
		return Hardware{}, fmt.Errorf("sim: no serving profile for model %q on h200; give the GPUs per engine and the weights' size", model)
	}
	h := H200
	h.GPUs, h.WeightsBytes = s.gpus, s.weights
	return h, nil
}

func (h *Hardware) fill() {
	if h.MemoryFraction == 0 {
		h.MemoryFraction = 0.9
	}
}

// Validate reports every problem with h.
func (h Hardware) Validate() error {
	h.fill()
	var errs []error
	if h.GPUs < 1 {
		errs = append(errs, fmt.Errorf("GPUs per engine %d: want at least 1", h.GPUs))
	}
	if !positive(h.HBMBytes) || !positive(h.HBMBytesPerSecond) || !positive(h.HostToGPUBytesPerSecond) {
		errs = append(errs, fmt.Errorf("HBM %v bytes at %v B/s, host-to-GPU %v B/s: want positive", h.HBMBytes, h.HBMBytesPerSecond, h.HostToGPUBytesPerSecond))
	}
	if !(h.MemoryFraction > 0 && h.MemoryFraction <= 1) {
		errs = append(errs, fmt.Errorf("memory fraction %v: want (0, 1]", h.MemoryFraction))
	}
	if h.WeightsBytes < 0 || math.IsNaN(h.WeightsBytes) {
		errs = append(errs, fmt.Errorf("weights %v bytes: want ≥ 0", h.WeightsBytes))
	} else if kv := h.KVBytes(); len(errs) == 0 && kv <= 0 {
		errs = append(errs, fmt.Errorf("the weights (%.1f GB) leave no room for KV in %d × %.0f GB × %.2f", h.WeightsBytes/1e9, h.GPUs, h.HBMBytes/1e9, h.MemoryFraction))
	}
	return errors.Join(errs...)
}

// KVBytes is the engine's memory for KV: its share of HBM less the
// weights.
func (h Hardware) KVBytes() float64 {
	h.fill()
	return float64(h.GPUs)*h.HBMBytes*h.MemoryFraction - h.WeightsBytes
}

// Apply sets cfg's engine terms from h for a model of kvBytesPerToken
// prefilling at curve's speed on one GPU: the prefill and the decode
// roofline scaled to the engine's GPUs, and its KV memory in blocks.
func (h Hardware) Apply(cfg *Config, curve cost.Prefill, kvBytesPerToken float64) error {
	if err := h.Validate(); err != nil {
		return fmt.Errorf("sim: hardware: %w", err)
	}
	h.fill()
	cfg.fill()
	cfg.KVBytesPerToken = kvBytesPerToken
	cfg.Prefill = curve
	if h.GPUs > 1 {
		cfg.Prefill = cost.Scaled{Base: curve, Factor: float64(h.GPUs)}
	}
	cfg.Decode.HBMBytesPerSecond = float64(h.GPUs) * h.HBMBytesPerSecond
	cfg.Decode.WeightsBytes = h.WeightsBytes
	cfg.HostToGPUBytesPerSecond = h.HostToGPUBytesPerSecond
	cfg.GPUBlocks = int(h.KVBytes() / (kvBytesPerToken * float64(cfg.BlockTokens)))
	return nil
}

// Profiles are the models and curves the simulator adds to the cost
// model's built-in ones: a sparse-attention Llama-3-8B keeping 1/8 of
// its KV, and DeepSeek-V3's prefill on an H200, estimated.
//
// The sparse profile prefills at Llama-3-8B's measured speed: an upper
// bound on its cost, since a sparse indexer also skips attention work.
//
// DeepSeek-V3 has no measured curve here; its estimate counts FLOPs per
// prompt of T tokens as 2 × 37e9 active parameters × T for the linear
// layers plus 61 layers × 128 heads × (192 + 128) × T² for causal MLA
// attention, at the 585 TFLOPS one H200 sustained prefilling Llama-3-70B
// at 32k tokens (../shared/anchors). MoE layers rarely reach a dense
// model's utilization, so this is optimistic: DeepSeek-V3 breaks even at
// a higher bandwidth than it may in practice.
func Profiles() cost.Document {
	llama, _ := cost.NewProfiles().Model("llama3-8b")
	sparse := llama
	sparse.Name, sparse.KeptFraction = "llama3-8b-sparse8", 0.125
	var llamaCurve cost.Curve
	for _, c := range cost.BuiltinCurves() {
		if c.Model == "llama3-8b" && c.Accelerator == "h200" {
			llamaCurve = c
		}
	}
	sparseCurve := cost.Curve{Model: sparse.Name, Accelerator: "h200", Points: llamaCurve.Points}
	flops := func(t float64) float64 { return 2*37e9*t + 61*128*(192+128)*t*t }
	var ds []cost.Point
	for _, t := range []int{1024, 4096, 16384, 32768, 131072} {
		ds = append(ds, cost.Point{Tokens: t, TokensPerSecond: math.Round(float64(t) / (flops(float64(t)) / 585e12))})
	}
	return cost.Document{
		Models: []cost.Model{sparse},
		Curves: []cost.Curve{sparseCurve, {Model: "deepseek-v3", Accelerator: "h200", Points: ds}},
	}
}
