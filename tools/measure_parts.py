"""How the PPO trainer is put together, measured (docs/internals.md, "The PPO trainer's parts, measured").

    python tools/measure_parts.py                 # this checkout (static numbers, then one traced update)
    PYTHONPATH=OTHER python tools/measure_parts.py --root OTHER --static-only   # another checkout's code

1. Trainer attributes each part reads: per part (rollout and scoring, the update's metrics, evaluation, PPO
   checkpoints), the attributes its code reads off an object it did not build: `self.X` in a mixin of the trainer
   that the mixin neither defines nor assigns, and `trainer.X` where a function takes the trainer. A part built from
   explicit inputs reads none.
2. The trainer's internal imports: the trl_ext modules trl_ext/ppo/trainer.py imports (each once).
3. Files under 60 lines in trl_ext/ppo.
4. Files a reader opens to follow one update from train() to the optimizer step (traced on the tiny models, one
   update of the default settings): the files of the code that runs, up to the first optimizer step, with the trainer
   or an object it holds (a part, an extension) as `self`, and of the functions between such calls on the stack (the
   epochs loop, the guarded step). Helpers that run and return (the math, sequences, devices) are not followed.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PARTS = {  # part -> (module, class) candidates, the mixin of before or the part of after
    "rollout and scoring": [("ppo/rollout/steps.py", "RolloutStepsMixin"), ("ppo/rollout/steps.py", "RolloutSteps")],
    "update metrics": [("ppo/update_metrics.py", "UpdateMetricsMixin"), ("ppo/update_metrics.py", "UpdateMetrics")],
    "evaluation": [("ppo/evaluation.py", "EvaluateMixin"), ("ppo/evaluation.py", "Evaluation")],
    "PPO checkpoints": [("ppo/checkpointing.py", "PPOCheckpointMixin"),
                        ("runtime/checkpoints.py", "PPOCheckpoints")],
}


def _class_reads(cls: ast.ClassDef) -> set[str]:
    """`self.X` read in ``cls`` that ``cls`` neither defines in its body nor assigns."""
    own = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    own |= {t.id for n in cls.body if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    reads = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            (own if isinstance(node.ctx, ast.Store) else reads).add(node.attr)
    return reads - own


def _trainer_reads(tree: ast.AST) -> set[str]:
    """`trainer.X` read anywhere in ``tree`` (functions taking the trainer)."""
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "trainer"}


def part_reads(package: Path) -> dict[str, dict]:
    out = {}
    for part, candidates in PARTS.items():
        for module, name in candidates:
            path = package / module
            if not path.is_file():
                continue
            tree = ast.parse(path.read_text())
            classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
            if not classes:
                continue
            reads = _class_reads(classes[0]) | _trainer_reads(tree)
            out[part] = {"code": f"{module}:{name}", "count": len(reads), "attributes": sorted(reads)}
            break
    return out


def trainer_taking_functions(package: Path) -> list[str]:
    """Functions of trl_ext/ppo with a parameter named ``trainer``."""
    found = []
    for path in sorted((package / "ppo").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    a.arg == "trainer" for a in node.args.args + node.args.kwonlyargs):
                found.append(f"{path.relative_to(package).as_posix()}:{node.name}")
    return found


def trainer_imports(package: Path) -> list[str]:
    path = package / "ppo" / "trainer.py"
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = ["trl_ext", "ppo"][: 2 - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                sub = target + "." + alias.name
                modules.add(sub if (package.parent / (sub.replace(".", "/") + ".py")).is_file()
                            or (package.parent / sub.replace(".", "/")).is_dir() else target)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trl_ext"):
            modules.add(node.module)
    return sorted(modules)


def small_files(package: Path, limit: int = 60) -> list[str]:
    return sorted(f"{p.relative_to(package).as_posix()} ({len(p.read_text().splitlines())})"
                  for p in (package / "ppo").rglob("*.py") if len(p.read_text().splitlines()) < limit)


def traced_files() -> list[str]:
    """Item 4 of the module docstring, on this interpreter's trl_ext."""
    import tempfile

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    import trl_ext
    from trl_ext.testing import build_tiny_models, tiny_corpus

    package = Path(trl_ext.__file__).resolve().parent
    work = Path(tempfile.mkdtemp())
    models = build_tiny_models(work / "models")
    tok = AutoTokenizer.from_pretrained(models.tokenizer)
    tok.padding_side = "left"
    prompts = Dataset.from_dict({"input_ids": [tok(" ".join(t.split()[:4]))["input_ids"] for t in tiny_corpus(8)]})
    args = trl_ext.PPOConfig(output_dir=str(work / "run"), use_cpu=True, report_to="none", total_episodes=4,
                             per_device_train_batch_size=2, gradient_accumulation_steps=2, response_length=8,
                             num_sample_generations=0, save_strategy="no", stop_token="eos", disable_tqdm=True,
                             local_rollout_forward_batch_size=2)
    trainer = trl_ext.PPOTrainer(args=args, processing_class=tok,
                                 model=AutoModelForCausalLM.from_pretrained(models.policy), ref_model=None,
                                 reward_model=AutoModelForSequenceClassification.from_pretrained(models.reward),
                                 value_model=AutoModelForSequenceClassification.from_pretrained(models.reward),
                                 train_dataset=prompts)
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    files, done = set(), []

    def ours(frame) -> bool:
        return Path(frame.f_code.co_filename).resolve().is_relative_to(package)

    def followed(frame) -> bool:  # its self is the trainer or an object the trainer holds
        this = frame.f_locals.get("self")
        return this is trainer or (this is not None and any(this is v for v in vars(trainer).values()))

    def record(frame):
        chain, stack = [], frame
        while stack is not None:  # ours between here and the nearest followed caller: the trail to this call
            if ours(stack):
                chain.append(stack)
            if followed(stack) and ours(stack) and stack is not frame:
                break
            stack = stack.f_back
        for f in chain:
            files.add(Path(f.f_code.co_filename).resolve().relative_to(package.parent).as_posix())

    def profile(frame, event, arg):
        if done or event != "call":
            return
        if ours(frame) and followed(frame):
            record(frame)

    def stop(*_):
        done.append(True)
        record(sys._getframe(1))  # the frames that led to the optimizer's step
        sys.setprofile(None)

    optimizer.register_step_pre_hook(stop)
    torch.manual_seed(0)
    sys.setprofile(profile)
    try:
        trainer.train()
    finally:
        sys.setprofile(None)
    return sorted(files)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(ROOT), help="the checkout whose trl_ext/ is read (static numbers)")
    parser.add_argument("--static-only", action="store_true", help="skip the traced update")
    options = parser.parse_args(argv)
    package = Path(options.root) / "trl_ext"
    report = {"part_reads": part_reads(package), "trainer_taking_functions": trainer_taking_functions(package),
              "trainer_imports": trainer_imports(package), "ppo_files_under_60_lines": small_files(package)}
    if not options.static_only:
        with contextlib.redirect_stdout(sys.stderr):  # the libraries' and the run's printing: not the report's
            report["files_followed_train_to_step"] = traced_files()
    for key in ("trainer_taking_functions", "trainer_imports", "ppo_files_under_60_lines",
                "files_followed_train_to_step"):
        if key in report:
            report[key + "_count"] = len(report[key])
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
