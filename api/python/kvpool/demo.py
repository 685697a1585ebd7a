"""python3 -m kvpool.demo: two engines reuse a prompt's KV through the pool.

It starts two `kvpool node serve` daemons (B runs the embedded etcd, A
joins it) and three engine processes (kvpool.engine, the transformer of
kvpool.model on the CPU): engine A prefills a 1024-token prompt on node A
and saves its KV; engine B gets a prompt that shares the first 768 tokens,
asks node B to plan, fetches the shared prefix from A, loads it into its
pages and prefills only the rest; then B recomputes everything, for
comparison. It prints both prefill times and whether the tokens agree.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from .daemon import Daemon, find_binary
from .engine import PROFILE_MODEL, profile_document
from .model import ModelConfig

BLOCK_TOKENS = 64  # the engine's block: 4 pages of 16 tokens
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])


def start_cluster(directory, binary=None, prefill_tokens_per_second=4000.0):
    """Starts nodes B (with the embedded etcd) and A (joining it), both
    planning for the demo model. Returns (a, b)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    profile = d / "tiny.json"
    profile.write_text(json.dumps(profile_document(ModelConfig(), prefill_tokens_per_second)))
    flags = ["--accelerator", "cpu", "--model", PROFILE_MODEL, "--block-tokens", str(BLOCK_TOKENS), "--profiles", str(profile)]
    b = Daemon.start("engine-b", d / "b", extra=flags, binary=binary)
    try:
        a = Daemon.start("engine-a", d / "a", etcd_url=b.etcd_url, extra=flags, binary=binary)
    except BaseException:
        b.stop()
        raise
    return a, b


def engine_command(server, tenant, prompt_file, *extra):
    """The command line of one engine process."""
    return ["/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable, "-m", "kvpool.engine",
            "--server", server, "--tenant", tenant, "--prompt", str(prompt_file), "--threads", "2", *extra]


def engine_env():
    return dict(os.environ, PYTHONPATH=_PACKAGE_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def run_engine(server, tenant, prompt_file, *extra, timeout=300):
    """Runs one engine process and returns its JSON report."""
    r = subprocess.run(engine_command(server, tenant, prompt_file, *extra), env=engine_env(), capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"engine exited with {r.returncode}:\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def prompts(prompt_tokens=1024, shared_tokens=768, seed=7):
    """Engine A's prompt, and engine B's sharing its first shared_tokens."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, ModelConfig().vocab_size, prompt_tokens).tolist()
    return a, a[:shared_tokens] + rng.integers(0, ModelConfig().vocab_size, prompt_tokens - shared_tokens).tolist()


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m kvpool.demo", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--prompt-tokens", type=int, default=1024, help="prompt length (default 1024)")
    p.add_argument("--shared-tokens", type=int, default=768, help="prefix B shares with A (default 768)")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens B decodes (default 32)")
    args = p.parse_args(argv)
    if args.shared_tokens % BLOCK_TOKENS or not 0 < args.shared_tokens <= args.prompt_tokens:
        p.error(f"--shared-tokens must be a positive multiple of {BLOCK_TOKENS}, at most --prompt-tokens")
    binary = find_binary()
    with tempfile.TemporaryDirectory(prefix="kvpool-demo-") as tmp:
        d = Path(tmp)
        prompt_a, prompt_b = prompts(args.prompt_tokens, args.shared_tokens)
        (d / "a.json").write_text(json.dumps(prompt_a))
        (d / "b.json").write_text(json.dumps(prompt_b))
        print(f"starting nodes A and B (etcd embedded in B) from {binary}")
        a, b = start_cluster(d / "nodes", binary)
        try:
            ra = run_engine(a.addr, "demo", d / "a.json", "--new-tokens", "1", "--save")
            print(f"engine A: prefilled {args.prompt_tokens} tokens in {ra['prefill_s'] * 1000:.0f} ms, saved {ra['saved_blocks']} blocks of {BLOCK_TOKENS} tokens to node A")
            new = str(args.new_tokens)
            pooled = run_engine(b.addr, "demo", d / "b.json", "--warmup", "--new-tokens", new, "--logits", str(d / "pool.npy"))
            alone = run_engine(b.addr, "demo-alone", d / "b.json", "--warmup", "--no-pool", "--new-tokens", new, "--logits", str(d / "alone.npy"))
        finally:
            a.stop()
            b.stop()
        diff = float(np.abs(np.load(d / "pool.npy") - np.load(d / "alone.npy")).max())
        print(f"engine B with the pool: plan {pooled['plan']!r} from {pooled['source'] or 'nowhere'}; fetched {pooled['fetched_blocks']} blocks "
              f"({pooled['fetch_s'] * 1000:.1f} ms), loaded {pooled['loaded_blocks']} ({pooled['load_s'] * 1000:.1f} ms), "
              f"computed {pooled['computed_tokens']} tokens ({pooled['compute_s'] * 1000:.0f} ms)")
        print(f"prefill of B's {args.prompt_tokens}-token prompt: {pooled['prefill_s'] * 1000:.0f} ms with the pool, "
              f"{alone['prefill_s'] * 1000:.0f} ms recomputing ({alone['prefill_s'] / pooled['prefill_s']:.1f}x)")
        same = pooled["tokens"] == alone["tokens"]
        print(f"{args.new_tokens} decoded tokens equal: {same}; max logit difference {diff:.2e}")
        return 0 if same and diff <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
