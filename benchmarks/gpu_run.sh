#!/usr/bin/env bash
# The prepared GPU run of benchmarks/gpu_ppo.py (benchmarks/README.md section 7): about 7 minutes on one H200.
#
#   bash benchmarks/gpu_run.sh wheels   # on a machine WITH a package registry: download the wheels into .whl, .whl112
#   bash benchmarks/gpu_run.sh run      # on the GPU machine (no network): install them into site dirs, run, print
#   bash benchmarks/gpu_run.sh graphs   # there: `fast` against `graphs` (rollout_cuda_graphs), 8B and 0.5B
#
# `run` installs .whl into /tmp/site and TRL 1.12 (.whl112) into /tmp/trl112 with --target (nothing touches the
# machine's own environment), puts /tmp/site on PYTHONPATH (the benchmark passes it on to its children) and runs:
#   8B shape, uneven workload, 16 episodes per update (2 x 8), 24 GiB target: trl112, fast, engine; then one more
#     `fast` update under torch.profiler (benchmarks/update_profile.py: prefill, 4 decoding steps, scoring,
#     optimization; the decode and optimization windows' Chrome traces gzipped)
#   0.5B shape, uneven workload, 16 episodes per update (8 x 2), 4 PPO epochs: trl112, fast
# Results: benchmarks/results/gpu_ppo_<shape>_uneven.json and .md (the 8B's profile: *_profile.md), rewritten after
# each variant; with GPU_RUN_OUT set, copied there (with the traces) after each shape.
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
    out=${GPU_RUN_OUT:-benchmarks/results}
    timeout 340 python3 benchmarks/gpu_ppo.py --shape llama-3-8b --workload uneven --accumulation 8 \
      --variants trl112,fast,engine --max-memory-gib 24 --trl112-site /tmp/trl112 --profile fast \
      --trace-dir "$out" || echo "8B: stopped (rc $?)"
    cp benchmarks/results/gpu_ppo_llama-3-8b_uneven.{json,md} benchmarks/results/*_profile.md "$out"/ 2>/dev/null || true
    cat benchmarks/results/gpu_ppo_llama-3-8b_uneven.log || true  # the children's stderr (into the run's log)
    timeout 130 python3 benchmarks/gpu_ppo.py --shape qwen2.5-0.5b --workload uneven --accumulation 2 \
      --variants trl112,fast --trl112-site /tmp/trl112 || echo "0.5B: stopped (rc $?)"
    cp benchmarks/results/gpu_ppo_qwen2.5-0.5b_uneven.{json,md} "$out"/ 2>/dev/null || true
    cat benchmarks/results/gpu_ppo_qwen2.5-0.5b_uneven.log || true
    cat benchmarks/results/gpu_ppo_llama-3-8b_uneven*.md benchmarks/results/gpu_ppo_qwen2.5-0.5b_uneven.md || true ;;
  graphs)  # rollout_cuda_graphs before/after on one card: graphs then fast, 8B then 0.5B (about 6 minutes)
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD"
    out=${GPU_RUN_OUT:-benchmarks/results}
    timeout 260 python3 benchmarks/gpu_ppo.py --shape llama-3-8b --workload uneven --accumulation 8 \
      --variants graphs,fast --max-memory-gib 24 --out "$out/graphs_llama-3-8b.json" || echo "8B: stopped (rc $?)"
    cat "$out/graphs_llama-3-8b.log" || true  # the children's stderr: where a stopped variant was
    timeout 120 python3 benchmarks/gpu_ppo.py --shape qwen2.5-0.5b --workload uneven --accumulation 2 \
      --variants graphs,fast --out "$out/graphs_qwen2.5-0.5b.json" || echo "0.5B: stopped (rc $?)"
    cat "$out/graphs_qwen2.5-0.5b.log" || true ;;
  *) echo "usage: $0 wheels|run|graphs" >&2; exit 2 ;;
esac
