"""An inference engine on kvpool: the small transformer of kvpool.model with
a paged KV cache, reusing KV through the pool the way a vLLM worker would.

Engine.serve(prompt) cuts the prompt into chain keys, asks its daemon to
plan (recompute, fetch, or split), fetches what the plan says from the
node holding it, loads the blocks into its pages (kvpool.kvcache),
prefills only what it still lacks and decodes greedily. Any block the pool
cannot deliver (missing, failing its checksum, its holder dead) is
recomputed, with everything after it: a pool fault costs time, never a
wrong token.

Run as a process (what the engine tests and kvpool.demo start):

    python3 -m kvpool.engine --server ADDR --tenant T --prompt prompt.json \
        --new-tokens 32 [--no-pool] [--save] [--logits out.npy]

It prints one JSON object: the tokens, where the prefix came from, and the
time each step took.
"""

import argparse
import json
import sys
import time

import numpy as np
import torch

from . import errors
from .chain import chain_keys
from .client import Client
from .kvcache import PagedKVAdapter
from .model import Model, ModelConfig, PagedKVCache

PROFILE_MODEL = "kvpool-tiny"  # the cost-model profile of ModelConfig's default shape


def profile_document(config, tokens_per_second, accelerator="cpu", prompt_tokens=1024):
    """A --profiles document for the daemons: the model's KV shape and a
    prefill curve through one measured point."""
    return {
        "models": [{"name": PROFILE_MODEL, "layers": config.n_layers, "kv_heads": config.n_kv_heads,
                    "head_dim": config.head_dim, "dtype_bytes": torch.empty((), dtype=config.dtype).element_size()}],
        "curves": [{"model": PROFILE_MODEL, "accelerator": accelerator,
                    "points": [{"tokens": prompt_tokens, "tokens_per_s": tokens_per_second}]}],
    }


class Engine:
    """One engine: a model, its paged KV cache and its node's client."""

    def __init__(self, client, config=None, num_pages=512, page_tokens=16, pages_per_block=4, seed="0"):
        self.config = config or ModelConfig()
        self.model = Model(self.config)
        self.cache = PagedKVCache(self.config, num_pages, page_tokens)
        self.client = client
        self.kv = PagedKVAdapter(client, self.cache.layers, pages_per_block, self.config.fingerprint())
        self.block_tokens = self.kv.block_tokens
        self.seed = seed

    def keys(self, prompt):
        return chain_keys(prompt, self.block_tokens, scheme="sha256_cbor", seed=self.seed)

    def serve(self, prompt, new_tokens, use_pool=True, save=False, fetch_pause=None):
        """Runs one request. fetch_pause(blocks_fetched) is a test hook
        called between the two halves of a fetch."""
        t0 = time.perf_counter()
        tokens = torch.as_tensor(list(prompt), dtype=torch.long)
        keys = self.keys(prompt)
        pages = self.cache.allocate(self.cache.pages_for(len(tokens) + new_tokens))
        report = {"blocks": len(keys), "local_blocks": 0, "fetched_blocks": 0, "loaded_blocks": 0, "plan": "recompute",
                  "source": "", "fetch_errors": [], "computed_tokens": 0}
        timing = {"plan_s": 0.0, "fetch_s": 0.0, "load_s": 0.0, "compute_s": 0.0}
        try:
            have = 0  # leading positions whose KV is in the pages
            if use_pool and keys:
                have = self._reuse(tokens, keys, pages, report, timing, fetch_pause)
            t = time.perf_counter()
            logits = self.model.prefill(tokens, self.cache, pages, start=have)[-1]
            timing["compute_s"] += time.perf_counter() - t
            report["computed_tokens"] += len(tokens) - have
            prefill_s = time.perf_counter() - t0
            out, all_logits = [], []
            pos = len(tokens)
            for i in range(new_tokens):
                all_logits.append(logits)
                nxt = int(torch.argmax(logits))
                out.append(nxt)
                if i + 1 < new_tokens:
                    logits = self.model.decode(nxt, pos, self.cache, pages)
                    pos += 1
            if save and keys:
                report["saved_blocks"] = self.kv.save(keys, pages)
        finally:
            self.cache.free(pages)
        report.update(timing, tokens=out, prefill_s=prefill_s, total_s=time.perf_counter() - t0)
        return report, torch.stack(all_logits) if all_logits else torch.empty(0)

    def _reuse(self, tokens, keys, pages, report, timing, fetch_pause):
        """Brings as much of the prefix as the plan says into the pages and
        returns how many leading positions are there."""
        bt = self.block_tokens
        t = time.perf_counter()
        answer = self.kv.client.plan(keys, model=PROFILE_MODEL, block_tokens=bt, prompt_tokens=len(tokens),
                                  candidates=[self.client.node_id])
        plan = next((n for n in answer.nodes if n.node_id == self.client.node_id), None)
        if plan is None:
            raise errors.Internal(f"kvpool: the plan has no entry for this engine's node {self.client.node_id}")
        timing["plan_s"] = time.perf_counter() - t
        local, pool = plan.local_blocks, plan.pool_blocks
        # Blocks [0, local) are here; with fetch the node pulls [local, pool),
        # with split it computes [local, split) while [split, pool) load.
        first = {"fetch": local, "split": plan.split_blocks}.get(plan.plan, pool)
        report.update(plan=plan.plan, local_blocks=local, source=plan.source, first_fetched_block=first)
        t = time.perf_counter()
        good = first
        if first < pool:
            wanted = keys[first:pool]
            halves = [wanted] if fetch_pause is None else [wanted[:len(wanted) // 2], wanted[len(wanted) // 2:]]
            results = []
            for i, part in enumerate(halves):
                if i:
                    fetch_pause(len(results))
                try:
                    results += self.kv.client.fetch(part)
                except errors.KVPoolError as e:
                    results += [None] * len(part)
                    report["fetch_errors"].append(f"{type(e).__name__}: {e}")
            for r in results:
                if r is None or r.error is not None:
                    if r is not None:
                        report["fetch_errors"].append(f"{type(r.error).__name__}: {r.error}")
                    break
                good += 1
            report["fetched_blocks"] = good - first
        timing["fetch_s"] = time.perf_counter() - t
        t = time.perf_counter()
        have = self.kv.load(keys[:local], pages)
        timing["load_s"] += time.perf_counter() - t
        if have < local:
            return have * bt  # the node lost blocks since it planned: compute the rest
        if first > local:  # the split's head
            t = time.perf_counter()
            self.model.prefill(tokens[:first * bt], self.cache, pages, start=local * bt)
            timing["compute_s"] += time.perf_counter() - t
            report["computed_tokens"] += (first - local) * bt
        t = time.perf_counter()
        loaded = self.kv.load(keys[:good], pages, start=first)
        timing["load_s"] += time.perf_counter() - t
        report["loaded_blocks"] = local + loaded
        return (first + loaded) * bt


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m kvpool.engine", description="Runs one kvpool engine request and prints a JSON report.")
    p.add_argument("--server", required=True, help="the engine's kvpool node, host:port")
    p.add_argument("--tenant", default="engine", help="pool tenant (default engine)")
    p.add_argument("--prompt", required=True, help="JSON file holding the prompt's token ids")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens to decode greedily (default 32)")
    p.add_argument("--no-pool", action="store_true", help="recompute the whole prompt")
    p.add_argument("--save", action="store_true", help="save the prompt's KV blocks to the pool afterwards")
    p.add_argument("--logits", help="write the chosen tokens' logits here (.npy)")
    p.add_argument("--pause-between-fetches", action="store_true",
                   help="test hook: fetch in two halves, print 'paused' and wait for a line on stdin between them")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    p.add_argument("--warmup", action="store_true", help="run one recompute of the prompt before the request")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with open(args.prompt) as f:
        prompt = json.load(f)
    pause = None
    if args.pause_between_fetches:
        def pause(n):
            print(json.dumps({"paused": n}), flush=True)
            sys.stdin.readline()
    with Client(args.server, tenant=args.tenant, namespace="default") as client:
        engine = Engine(client)
        if args.warmup:
            engine.serve(prompt, 1, use_pool=False)
        report, logits = engine.serve(prompt, args.new_tokens, use_pool=not args.no_pool, save=args.save, fetch_pause=pause)
    if args.logits:
        np.save(args.logits, logits.numpy())
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
