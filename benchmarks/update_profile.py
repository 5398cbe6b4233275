"""Where one PPO update's time goes: torch.profiler windows over an update of trl-ext's ``PPOTrainer``
(``gpu_ppo.py --profile VARIANT``).

Installed on a trainer, :class:`UpdateProfile` counts the policy's forward calls during the rollout from the start
(a forward with more than one new position is a prefill, one with a single position a decoding step), so that each
timed update's rollout time can be read per decoding step without a profiler. Armed for one update
(:meth:`UpdateProfile.arm`, the benchmark arms it after the timed updates), it profiles four windows of that update,
each its own ``torch.profiler`` run with the device synchronised at both ends, so that the wall time and the kernels
in it belong together:

* ``prefill``: the rollout's first policy forward (the prompts, every position);
* ``decode``: ``decode_steps`` consecutive decoding steps from decoding step ``decode_start`` of the rollout (each
  step: the forward, the logits processors, the sampling, the stop check);
* ``scoring``: the whole ``score_rollouts`` step (reference log-probs, values, scores);
* ``optimization``: the whole ``optimize`` step (every forward, backward and optimizer step of the update).

Each window's summary (:func:`summarise`): wall ms; GPU kernel ms (the sum of the kernels' durations, i.e. the time
the GPU was busy; 0 on CPU) and the idle share ``1 - kernel / wall`` (launch and Python overhead, host syncs); time
in CUDA runtime calls (``cudaLaunchKernel`` and kin: the launch cost itself); time outside any profiled op (the
Python between the ops, plus the profiler's own cost); op and kernel counts; the top kernels and the top CPU ops by
self time. Per-step figures divide by the window's steps. The profiler makes every op slower on the host, so a
window's wall is above the unprofiled one: compare with the unprofiled per-step figure (``decode_ms_per_step`` of
the timed updates: rollout seconds / decoding steps, prefill included).
"""

from __future__ import annotations

import gzip
import shutil
import time
from pathlib import Path

__all__ = ["UpdateProfile", "summarise", "profile_table"]

TOP = 12
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaMemcpyAsync",
                "cudaMemsetAsync", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventRecord")


def _merged_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by a set of ``(start, end)`` intervals (overlaps counted once)."""
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


def summarise(prof, wall_s: float, steps: int = 1, top: int = TOP) -> dict:
    """The summary of one profiler window (module docstring); times in ms, per step where ``steps`` > 1."""
    from torch.autograd import DeviceType

    events = prof.events()
    device = [e for e in events if e.device_type != DeviceType.CPU]
    host = [e for e in events if e.device_type == DeviceType.CPU]
    kernel_us = sum(e.time_range.elapsed_us() for e in device)
    top_level = [(e.time_range.start, e.time_range.end) for e in host if e.cpu_parent is None]
    in_ops_us = _merged_length(top_level)
    runtime_us = sum(e.self_cpu_time_total for e in host if e.name in LAUNCH_CALLS)
    wall_us = wall_s * 1e6
    kernels, ops = {}, {}
    for e in device:
        k = kernels.setdefault(e.name, [0.0, 0])
        k[0] += e.time_range.elapsed_us()
        k[1] += 1
    for e in host:
        o = ops.setdefault(e.name, [0.0, 0])
        o[0] += e.self_cpu_time_total
        o[1] += 1
    per = 1e3 * steps  # us -> ms per step

    def ranked(table: dict) -> list[dict]:
        rows = sorted(table.items(), key=lambda kv: -kv[1][0])[:top]
        return [{"name": name[:90], "ms": us / per, "calls": n / steps} for name, (us, n) in rows]

    return {
        "steps": steps, "wall_ms": wall_us / per, "kernel_ms": kernel_us / per,
        "gpu_idle_share": (1 - kernel_us / wall_us) if wall_us and device else None,
        "runtime_calls_ms": runtime_us / per, "outside_ops_ms": max(wall_us - in_ops_us, 0.0) / per,
        "kernels": len(device) / steps, "host_ops": len(host) / steps,
        "launches": sum(1 for e in host if e.name in LAUNCH_CALLS[:4]) / steps,
        "top_kernels": ranked(kernels), "top_cpu_ops": ranked(ops),
    }


class UpdateProfile:
    """Counts the policy's rollout forwards; once armed, profiles one update's windows (module docstring).

    ``trainer``: a trl-ext ``PPOTrainer`` (its steps are wrapped); ``policy``: its policy (a ``PeftModel`` or a plain
    causal LM; the hooks go on its base causal LM, which ``generate`` and the policy's forwards call). ``trace_dir``:
    where the ``decode`` and ``optimization`` windows' Chrome traces are written (gzipped), if given.
    """

    def __init__(self, trainer, policy, *, cuda: bool, decode_start: int = 16, decode_steps: int = 4,
                 trace_dir: str | Path | None = None):
        self.cuda = cuda
        self.decode_start, self.decode_steps = decode_start, decode_steps
        self.trace_dir = Path(trace_dir) if trace_dir else None
        self.phase = None
        self.armed = False
        self.decode_counts: list[int] = []  # decoding steps of each update's rollout
        self.prefill_counts: list[int] = []
        self.windows: dict[str, dict] = {}
        self._prof = None
        self._window = None
        base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
        base.register_forward_pre_hook(self._pre, with_kwargs=True)
        base.register_forward_hook(self._post, with_kwargs=True)
        for step, phase in (("sample_turn", "rollout"), ("score_rollouts", "scoring"), ("optimize", "optimization")):
            setattr(trainer, step, self._wrapped(getattr(trainer, step), phase))

    # ------------------------------------------------------------------ windows

    def _start(self, name: str) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        if self.cuda:
            torch.cuda.synchronize()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self._prof = profile(activities=activities)
        self._prof.start()
        self._window = (name, time.perf_counter())

    def _stop(self, steps: int = 1) -> None:
        import torch

        if self._prof is None:
            return
        if self.cuda:
            torch.cuda.synchronize()
        name, t0 = self._window
        wall = time.perf_counter() - t0
        self._prof.stop()
        self.windows[name] = summarise(self._prof, wall, steps)
        if self.trace_dir is not None and name in ("decode", "optimization"):
            self.trace_dir.mkdir(parents=True, exist_ok=True)
            raw = self.trace_dir / f"trace_{name}.json"
            self._prof.export_chrome_trace(str(raw))
            with open(raw, "rb") as src, gzip.open(f"{raw}.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            raw.unlink()
        self._prof, self._window = None, None

    # ------------------------------------------------------------------ hooks

    def _wrapped(self, step, phase: str):
        def run(*args, **kwargs):
            outer, self.phase = self.phase, phase
            if phase == "rollout" and outer is None:
                self.decode_counts.append(0)
                self.prefill_counts.append(0)
            profiled = self.armed and phase in ("scoring", "optimization") and self._prof is None
            if profiled:
                self._start(phase)
            try:
                return step(*args, **kwargs)
            finally:
                if profiled:
                    self._stop()
                if phase == "rollout" and self._window is not None and self._window[0] == "decode":
                    self._stop(self._decode_profiled())  # the rollout ended inside the window
                self.phase = outer
                if phase == "optimization" and self.armed:
                    self.armed = False  # one update only

        return run

    def _decode_profiled(self) -> int:
        return self.decode_counts[-1] - self.decode_start + 1  # from the start step to the rollout's last one

    @staticmethod
    def _new_positions(args, kwargs) -> int:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        return int(ids.shape[1]) if ids is not None else 1

    def _pre(self, module, args, kwargs):
        if self.phase != "rollout":
            return
        if self._new_positions(args, kwargs) > 1:
            self.prefill_counts[-1] += 1
            if self.armed and "prefill" not in self.windows and self._prof is None:
                self._start("prefill")
            return
        self.decode_counts[-1] += 1
        step, n = self.decode_counts[-1], self.decode_steps
        if self.armed and step == self.decode_start and "decode" not in self.windows and self._prof is None:
            self._start("decode")
        elif self._window is not None and self._window[0] == "decode" and step == self.decode_start + n:
            self._stop(n)

    def _post(self, module, args, kwargs, output):
        if self._window is not None and self._window[0] == "prefill":
            self._stop()

    def arm(self) -> None:
        """Profile the next update's windows."""
        self.armed = True


def profile_table(profile: dict, unprofiled_ms_per_step: float | None = None) -> str:
    """A markdown summary: one row per window, then each window's top kernels (GPU) or top CPU ops (CPU)."""
    lines = ["| window | steps | wall ms (per step) | GPU kernel ms | GPU idle | CUDA runtime calls ms | outside ops "
             "ms | kernels | launches | host ops |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, w in profile["windows"].items():
        idle = f"{w['gpu_idle_share']:.0%}" if w["gpu_idle_share"] is not None else "-"
        lines.append(f"| {name} | {w['steps']} | {w['wall_ms']:.1f} | {w['kernel_ms']:.1f} | {idle} | "
                     f"{w['runtime_calls_ms']:.1f} | {w['outside_ops_ms']:.1f} | {w['kernels']:.0f} | "
                     f"{w['launches']:.0f} | {w['host_ops']:.0f} |")
    if unprofiled_ms_per_step is not None:
        lines.append(f"\nWithout the profiler: {unprofiled_ms_per_step:.1f} ms per decoding step (rollout seconds / "
                     "decoding steps, prefill included).")
    for name, w in profile["windows"].items():
        for what in ("top_kernels", "top_cpu_ops"):
            if not w[what]:
                continue
            lines += ["", f"{name}, {what.replace('_', ' ')} (ms per step, calls per step):", ""]
            lines += [f"- {r['ms']:.2f} ms, {r['calls']:.0f}x `{r['name']}`" for r in w[what]]
    return "\n".join(lines)
