#!/bin/sh
# Reproduces docs/routing.md's simulations and plots: every model at the
# time scale where its cost router first has a p90 TTFT of 1 s, the link
# grid, five seeds, and the host-tier sweep. About five minutes on two
# cores. Usage: docs/routing/run.sh [TRACE] [OUTDIR]
set -e
T=${1:-../shared/traces/conversation_trace.jsonl}
OUT=${2:-routing-runs}
KVPOOL=${KVPOOL:-kvpool}
mkdir -p "$OUT"
for ms in llama3-8b:4 llama3-70b:1 deepseek-v3:4.5 llama3-8b-sparse8:5; do
  m=${ms%%:*}; s=${ms##*:}
  $KVPOOL sim --trace "$T" --nodes 8 --model $m --time-scale $s \
    --policies round-robin,least-loaded,affinity,cost,oracle --sweep seed=1,2,3,4,5 --json > "$OUT/nopool-$m.json"
  $KVPOOL sim --trace "$T" --nodes 8 --model $m --time-scale $s --policies pool,pool-split \
    --sweep link-gbps=1,2.5,5,10,25,50,100,200,400 --sweep seed=1,2,3,4,5 --json > "$OUT/pool-$m.json"
done
$KVPOOL sim --trace "$T" --nodes 8 --model llama3-8b --time-scale 4 --policies cost,pool,pool-split,oracle \
  --sweep host-gb=200,500,1000,2000 --sweep link-gbps=10,100 --sweep seed=1,2,3,4,5 --json > "$OUT/host-llama3-8b.json"
files=""
for m in llama3-8b llama3-70b deepseek-v3 llama3-8b-sparse8; do files="$files,$OUT/nopool-$m.json,$OUT/pool-$m.json"; done
$KVPOOL sim --plot "$OUT/plots" --plot-from "${files#,}"
