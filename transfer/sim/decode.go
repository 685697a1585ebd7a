package sim

// Roofline is the decode step of a batch on one accelerator: memory bound,
// each step reads the model's weights once and every sequence's KV cache
// once, so
//
//	step = (WeightsBytes + Σ KV bytes of the batch) / HBMBytesPerSecond + StepOverheadS
//
// Every term is an input (flags of kvpool sim): 4.8 TB/s is an H200's HBM3e
// bandwidth; Llama-3-8B's bf16 weights are 16 GB.
type Roofline struct {
	HBMBytesPerSecond float64
	WeightsBytes      float64
	// StepOverheadS is what a step costs beyond memory traffic (kernel
	// launches, sampling, the scheduler). Default 0.
	StepOverheadS float64
}

// StepS is the time of one decode step of a batch holding kvTokens tokens
// of KV in all, at kvBytesPerToken bytes each.
func (r Roofline) StepS(kvTokens int, kvBytesPerToken float64) float64 {
	return (r.WeightsBytes+float64(kvTokens)*kvBytesPerToken)/r.HBMBytesPerSecond + r.StepOverheadS
}
