"""``rollout_cuda_graphs``: the rollout's decoding steps replayed as CUDA graphs over a static KV cache
(:class:`DecodeGraph`), eager on CPU and after a failed capture. How it works:
docs/ppo-internals.md#decoding-as-cuda-graphs."""

from __future__ import annotations

import contextlib
import time
import warnings

import torch

__all__ = ["DecodeGraph", "DecodeGraphs"]

_PATCHED = ("_valid_auto_compile_criteria", "get_compiled_call")


class DecodeGraph:
    """The decoding forward of one ``generate`` call: eager for the first step, then one CUDA graph, replayed.

    ``forward``: the causal LM's ``__call__``. Steps whose tensors are not on CUDA, or whose shapes or other
    arguments differ from the captured step's, run eagerly (a shape change captures anew)."""

    def __init__(self, forward, owner: "DecodeGraphs"):
        self.forward, self.owner = forward, owner
        self.graph = self.inputs = self.output = self.key = None
        self.warmed_key = None

    @staticmethod
    def _key(kwargs: dict) -> tuple:
        key = []
        for name, value in sorted(kwargs.items()):
            if isinstance(value, torch.Tensor):
                key.append((name, tuple(value.shape), value.dtype, value.device))
            elif isinstance(value, (bool, int, float, str, type(None))):
                key.append((name, value))
            else:  # the cache: the same object for every step of a generate call
                key.append((name, id(value)))
        return tuple(key)

    def __call__(self, **kwargs):
        tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
        cuda = any(t.is_cuda for t in tensors.values())
        if not cuda or self.owner.failure is not None:
            self.owner.eager_steps += 1
            return self.forward(**kwargs)
        key = self._key(kwargs)
        if self.graph is not None and key == self.key:
            for name, tensor in tensors.items():
                self.inputs[name].copy_(tensor)
            self.graph.replay()
            self.owner.replays += 1
            return self.output
        if key != self.warmed_key:  # a new shape: one eager step first (lazy initialisations, cuBLAS workspaces)
            self.warmed_key = key
            self.owner.eager_steps += 1
            return self.forward(**kwargs)
        return self._capture(key, kwargs, tensors)

    def _capture(self, key, kwargs, tensors):
        self.release()
        start = time.perf_counter()
        inputs = {name: tensor.clone() for name, tensor in tensors.items()}
        graph = torch.cuda.CUDAGraph()
        # autocast's cache of cast weights would be freed after the capture, under the graph: off while capturing
        no_cast_cache = torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"),
                                       enabled=torch.is_autocast_enabled("cuda"), cache_enabled=False)
        try:
            with no_cast_cache, torch.cuda.graph(graph, capture_error_mode="thread_local"):
                output = self.forward(**{**kwargs, **inputs})
        except Exception as err:  # noqa: BLE001 - any capture failure: eager from now on, said once
            self.owner.fail(err)
            torch.cuda.synchronize()
            self.owner.eager_steps += 1
            return self.forward(**kwargs)
        self.graph, self.inputs, self.output, self.key = graph, inputs, output, key
        self.owner.captures += 1
        self.owner.capture_s += time.perf_counter() - start
        graph.replay()  # the capture recorded the step without running it
        self.owner.replays += 1
        return output

    def release(self) -> None:
        self.graph = self.inputs = self.output = self.key = None


class DecodeGraphs:
    """The rollout's CUDA-graph decoding (module docstring): counts over the run and the context that puts a
    :class:`DecodeGraph` under one ``generate`` call of ``model`` (a ``PeftModel`` or a causal LM)."""

    @classmethod
    def build(cls, args, rollout_engine, accelerator) -> DecodeGraphs | None:
        """The run's object for ``args.rollout_cuda_graphs``: None when the key is off, and when the rollout runs on
        continuous batching (``rollout_engine: auto`` may choose it; the graphs apply to ``generate`` only), which
        is then said once."""
        if not args.rollout_cuda_graphs:
            return None
        if rollout_engine is not None:
            accelerator.print("rollout_cuda_graphs: not applied: the rollout runs on continuous batching, and CUDA-graph "
                              "decoding applies to rollout_engine 'generate' only")
            return None
        return cls()

    def __init__(self):
        self.captures = self.replays = self.eager_steps = 0
        self.capture_s = 0.0  # seconds spent capturing (each torch.cuda.graph also syncs, collects and empties)
        self.failure: str | None = None

    def fail(self, err: Exception) -> None:
        self.failure = f"{type(err).__name__}: {err}".splitlines()[0][:300]
        warnings.warn(f"rollout_cuda_graphs: capturing the decoding step failed ({self.failure}); decoding eagerly "
                      "from now on", stacklevel=3)

    @contextlib.contextmanager
    def decoding(self, model):
        """Inside: ``model.generate`` (with a static cache) decodes through a fresh :class:`DecodeGraph`. transformers'
        hook for a compiled decoding forward is redirected on the causal LM instance and restored on exit."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        runner = DecodeGraph(base.__call__, self)
        saved = {name: base.__dict__[name] for name in _PATCHED if name in base.__dict__}
        base.__dict__["_valid_auto_compile_criteria"] = lambda model_kwargs, generation_config: True
        base.__dict__["get_compiled_call"] = lambda compile_config=None: runner
        try:
            yield runner
        finally:
            for name in _PATCHED:
                base.__dict__.pop(name, None)
            base.__dict__.update(saved)
            runner.release()

    def metrics(self) -> dict:
        """``rollout/cuda_graph_replays`` and ``rollout/eager_decode_steps`` so far (a capture failure makes every
        later step eager)."""
        return {"rollout/cuda_graph_replays": float(self.replays),
                "rollout/eager_decode_steps": float(self.eager_steps)}
