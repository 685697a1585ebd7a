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

// Batch is an engine's continuous decode batch: sequences that make one
// token per step until their answers are complete, and the KV they hold.
// The simulator's engines and kvpool replay's emulated ones both run on
// it. Not safe for concurrent use.
type Batch[T any] struct {
	seqs     []batchSeq[T]
	kvTokens int
}

type batchSeq[T any] struct {
	item                        T
	prompt, generated, finished int
}

// Add joins a sequence whose prefill of promptTokens made its first token,
// and whose answer is outputTokens long (at least 2: a shorter one is done
// at its prefill).
func (b *Batch[T]) Add(item T, promptTokens, outputTokens int) {
	b.seqs = append(b.seqs, batchSeq[T]{item: item, prompt: promptTokens, generated: 1, finished: outputTokens})
	b.kvTokens += promptTokens + 1
}

// Len is how many sequences decode.
func (b *Batch[T]) Len() int { return len(b.seqs) }

// KVTokens is the tokens of KV the batch holds: what a step reads.
func (b *Batch[T]) KVTokens() int { return b.kvTokens }

// Step is one decode step: every sequence makes a token, and those whose
// answers are complete leave the batch; they are appended to done, in the
// order they joined.
func (b *Batch[T]) Step(done []T) []T {
	kept := b.seqs[:0]
	for _, s := range b.seqs {
		s.generated++
		b.kvTokens++
		if s.generated >= s.finished {
			b.kvTokens -= s.prompt + s.generated
			done = append(done, s.item)
		} else {
			kept = append(kept, s)
		}
	}
	clear(b.seqs[len(kept):])
	b.seqs = kept
	return done
}
