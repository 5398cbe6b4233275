#!/usr/bin/env bash
# The prepared GPU run of benchmarks/gpu_ppo.py (benchmarks/README.md section 7): under 8 minutes on one GPU.
#
#   bash benchmarks/gpu_run.sh wheels   # on a machine WITH a package registry: download the wheels into .whl, .whl112
#   bash benchmarks/gpu_run.sh run      # on the GPU machine (no network): install them into site dirs, run, print
#
# `run` installs .whl into /tmp/site and TRL 1.12 (.whl112) into /tmp/trl112 with --target (nothing touches the
# machine's own environment), puts /tmp/site on PYTHONPATH (the benchmark passes it on to its children) and runs:
#   8B shape, uneven workload, 16 episodes per update (2 x 8): trl112, shared, fast (bf16 residual), engine; 24 GiB
#   0.5B shape, uneven workload, 32 episodes per update (8 x 4), 4 PPO epochs: trl112, fast
# Results: benchmarks/results/gpu_ppo_<shape>_uneven.json and .md, rewritten after each variant.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-run}" in
  wheels)
    platform=(--only-binary=:all: --python-version 3.12 --platform manylinux_2_24_x86_64
              --platform manylinux2014_x86_64 --platform any)
    pip download -q --no-deps "${platform[@]}" -d .whl trl "transformers>=5.24" peft bitsandbytes datasets dill \
      multiprocess
    pip download -q --no-deps "${platform[@]}" -d .whl112 "trl==1.12.*"
    du -sh .whl .whl112 ;;
  run)
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    python3 -m pip install -q --no-index --no-deps --target /tmp/trl112 .whl112/*.whl
    export PYTHONPATH="/tmp/site:$PWD"
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
    timeout 340 python3 benchmarks/gpu_ppo.py --shape llama-3-8b --workload uneven --accumulation 8 \
      --variants trl112,shared,fast,engine --max-memory-gib 24 --trl112-site /tmp/trl112 || echo "8B: stopped (rc $?)"
    timeout 130 python3 benchmarks/gpu_ppo.py --shape qwen2.5-0.5b --workload uneven --accumulation 4 \
      --variants trl112,fast --trl112-site /tmp/trl112 || echo "0.5B: stopped (rc $?)"
    cat benchmarks/results/gpu_ppo_llama-3-8b_uneven.md benchmarks/results/gpu_ppo_qwen2.5-0.5b_uneven.md ;;
  *) echo "usage: $0 wheels|run" >&2; exit 2 ;;
esac
