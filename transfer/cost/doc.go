// Package cost is kvpool's fetch-versus-recompute cost model: model
// profiles (how many KV bytes a token takes), prefill-speed curves per
// model and accelerator, and the planner, which says for each candidate
// node whether the request's prefix should be recomputed, fetched from
// the node that holds it, or split between the two, with every term.
//
// Everything here is pure: no goroutines, no I/O, no clocks. The daemon
// (package pool) fills a Request from its location mirror, gossiped load
// and measured links; the CLI fills one from profiles alone.
//
// The model, for node i with queue time a, local prefix h blocks, and a
// source s holding a prefix of p > h blocks over a link of bandwidth bw
// and round trip rtt, with P(T) the seconds node i's engine needs to
// prefill T tokens from an empty cache, B tokens per block, n prompt
// tokens and K KV bytes per token:
//
//	recompute = a + P(n) − P(hB)
//	fetch     = a + rtt + (p−h)·B·K/bw + P(n) − P(pB)
//	split(k)  = a + max(P(kB) − P(hB), rtt + (p−k)·B·K/bw) + P(n) − P(pB)
//
// When the node's engine reports its GPU cache (g leading blocks in GPU
// memory, Node.GPUBlocks) and the node knows its host-to-GPU rate hg, the
// local prefix is h = max(g, host prefix) and the host blocks the GPU
// lacks load first: a grows by (host prefix − g)·B·K/hg, and fetched
// blocks move at min(bw, hg), since they cross to the GPU too. Without
// those, every local block counts as usable at once.
//
// The split (Cake, ICML'25) computes blocks [h, k) while blocks [k, p)
// load, and picks the block k ∈ [h, p] that balances both; k = h is the
// pure fetch and k = p the pure recompute, so the split is never worse
// than either. The break-even bandwidth of a prompt is
// B* = c(n)·K, where c(n) = n / P(n) is the prefill speed at n tokens:
// a link slower than B* delivers KV more slowly than the engine computes
// it.
package cost
