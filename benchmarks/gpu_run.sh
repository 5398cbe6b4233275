#!/usr/bin/env bash
# The prepared GPU run of benchmarks/gpu_ppo.py (benchmarks/README.md section 7): about 9.5 minutes on one H200.
#
#   bash benchmarks/gpu_run.sh wheels   # on a machine WITH a package registry: the wheels into .whl, .whl112, and
#                                       # the trl_ext of BEFORE (default: main's first parent) into .before
#   bash benchmarks/gpu_run.sh run      # on the GPU machine (no network): install them into site dirs, run
#
# `run` installs .whl into /tmp/site and TRL 1.12 (.whl112) into /tmp/trl112 with --target (nothing touches the
# machine's own environment), puts /tmp/site on PYTHONPATH (the benchmark passes it on to its children) and runs:
#   8B shape, uneven workload, 16 episodes per update (2 x 8), 3 updates, 24 GiB target: fast (then one more update
#     under torch.profiler: benchmarks/update_profile.py), trl112, graphs (last: a capture that hangs costs itself);
#   0.5B shape at the Qwen recipes' settings (64 episodes as 8 x 8, chunk 64, 4 PPO epochs), one update each:
#     shared (ppo_shared.yaml's design) on this code and on .before's (logits of every position).
# Each variant runs in its own process with a time limit; results go to GPU_RUN_OUT (default benchmarks/results):
# gpu_8b.{json,md,log}, gpu_8b_profile.md, gpu_0.5b.{json,md,log}, rewritten after each variant.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-run}" in
  wheels)
    platform=(--only-binary=:all: --python-version 3.12 --platform manylinux_2_24_x86_64
              --platform manylinux2014_x86_64 --platform any)
    pip download -q --no-deps "${platform[@]}" -d .whl trl "transformers>=5.24" peft bitsandbytes datasets dill \
      multiprocess
    pip download -q --no-deps "${platform[@]}" -d .whl112 "trl==1.12.*"
    rm -rf .before && mkdir .before && git archive "${BEFORE:-HEAD^1}" trl_ext | tar -x -C .before
    du -sh .whl .whl112 .before ;;
  run)
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    python3 -m pip install -q --no-index --no-deps --target /tmp/trl112 .whl112/*.whl
    export PYTHONPATH="/tmp/site:$PWD"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    out=${GPU_RUN_OUT:-benchmarks/results}
    mkdir -p "$out"
    timeout 400 python3 benchmarks/gpu_ppo.py --shape llama-3-8b --workload uneven --accumulation 8 --updates 3 \
      --variants fast,trl112,graphs --max-memory-gib 24 --trl112-site /tmp/trl112 --profile fast \
      --child-timeout 170 --out "$out/gpu_8b.json" || echo "8B: stopped (rc $?)"
    timeout 160 python3 benchmarks/gpu_ppo.py --shape qwen2.5-0.5b --workload uneven --updates 1 \
      --variants shared,shared-before --before-site .before --child-timeout 75 --out "$out/gpu_0.5b.json" \
      || echo "0.5B: stopped (rc $?)"
    cat "$out"/gpu_8b.md "$out"/gpu_8b_profile.md "$out"/gpu_0.5b.md 2>/dev/null || true ;;
  *) echo "usage: $0 wheels|run" >&2; exit 2 ;;
esac
