"""Where trl_ext changes a config or a trainer's state, read from its source with `ast`: an assignment to `args.*` or
`state.*` (also `x.args.*`, `x.state.*`, `setattr(args, ...)`) happens only at the places listed here, each with why;
a function named `check_*`, `log_*` or `*_metrics` assigns no attribute at all; the step counter advances and the KL
controller steps at one place each, the update's top-level method."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "trl_ext"

# (file:function, what is assigned) -> why it may be assigned there. A new write fails the test, and so does an entry
# that no longer matches one (remove it then).
ALLOWED = {
    # TRL 1.12's PPOTrainer.__init__, kept statement for statement: the batch sizes it derives into the config
    **{("ppo/base/base_trainer.py:PPOBaseTrainer.__init__", f"args.{name}"): "TRL's derived batch keys"
       for name in ("total_episodes", "world_size", "local_batch_size", "micro_batch_size", "batch_size",
                    "mini_batch_size", "local_mini_batch_size", "num_total_batches")},
    # the config adapting itself, while it is constructed, to a CPU launch of a DeepSpeed/FSDP engine
    **{("runtime/engines.py:adapt_to_cpu_engine", f"args.{name}"): "the config's own construction"
       for name in ("ddp_backend", "dataloader_pin_memory", "use_cpu")},
    # `local_rollout_forward_batch_size: auto` resolved once at __init__, before anything reads the chunk
    ("ppo/memory/chunk.py:resolve_auto_rollout_chunk", "args.local_rollout_forward_batch_size"): "auto resolved",
    # argparse's namespace, not a config
    ("cli.py:main", "args.overrides"): "argparse namespace",
    ("cli.py:main", "args.verbose"): "argparse namespace",
    # HF's TrainerState: set up by train(), advanced by the update, rewound by the NaN/inf stop
    **{("ppo/trainer.py:PPOTrainer.init_train_state", f"{owner}.{name}"): "train()'s start"
       for owner, name in (("state", "is_local_process_zero"), ("state", "is_world_process_zero"),
                           ("self.state", "global_step"), ("self.state", "episode"), ("self.state", "max_steps"),
                           ("self.state", "num_train_epochs"))},
    ("ppo/trainer.py:PPOTrainer.init_train_state", "setattr(self.state)"): "train()'s start: logging/eval/save steps",
    **{("ppo/trainer.py:PPOTrainer.run_update", f"self.state.{name}"): "the update's one place"
       for name in ("episode", "epoch", "global_step")},
    ("ppo/trainer.py:PPOTrainer.save_update_start_checkpoint", "self.state.episode"): "rewind",
    ("runtime/checkpoints.py:AtomicCheckpointMixin._save_checkpoint", "self.state.best_model_checkpoint"):
        "the staging folder renamed",
    ("rewards/scoring.py:RewardScorer._light_state", "state.log_history"): "a copy of the state without its history",
}

STATELESS_NAME = re.compile(r"^(check_|log_)|metrics$")


def functions():
    """(relative path, qualified name, node) of every function in trl_ext."""
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text())

        def walk(node, prefix):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield rel, prefix + child.name, child
                    yield from walk(child, prefix + child.name + ".")
                elif isinstance(child, ast.ClassDef):
                    yield from walk(child, prefix + child.name + ".")
                else:
                    yield from walk(child, prefix)

        yield from walk(tree, "")


def own_nodes(function):
    """The nodes of ``function``'s body, not those of functions defined inside it (they are listed on their own)."""
    stack = list(function.body)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(child for child in ast.iter_child_nodes(node)
                     if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))


def targets(node):
    if isinstance(node, ast.Assign):
        return node.targets
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    return []


def config_or_state(target) -> str | None:
    """``args.x`` / ``state.x`` / ``a.b.args.x`` / ``self.state.x``: the assigned name as written, else None."""
    for sub in ast.walk(target):
        if isinstance(sub, ast.Attribute):
            owner = sub.value
            if (isinstance(owner, ast.Name) and owner.id in ("args", "state")) or (
                    isinstance(owner, ast.Attribute) and owner.attr in ("args", "state")):
                return ast.unparse(sub)
    return None


def setattr_owner(node) -> str | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
        owner = node.args[0]
        if (isinstance(owner, ast.Name) and owner.id in ("args", "state")) or (
                isinstance(owner, ast.Attribute) and owner.attr in ("args", "state")):
            return f"setattr({ast.unparse(owner)})"
    return None


def test_configs_and_states_are_written_only_where_listed():
    found = set()
    for rel, name, function in functions():
        for node in own_nodes(function):
            for target in targets(node):
                written = config_or_state(target)
                if written is not None:
                    found.add((f"{rel}:{name}", written))
            owner = setattr_owner(node)
            if owner is not None:
                found.add((f"{rel}:{name}", owner))
    allowed = set(ALLOWED)
    assert sorted(found - allowed) == [], "new writes to a config or a trainer state"
    assert sorted(allowed - found) == [], "listed writes that no longer happen: remove them from ALLOWED"


def test_checks_logs_and_metrics_assign_no_attribute():
    """``check_*``, ``log_*`` and ``*_metrics`` (``metrics`` too) say what they do: none sets an attribute of
    anything (a config, the trainer, a part), with ``=``, ``+=`` or ``setattr``."""
    offenders = []
    for rel, name, function in functions():
        if not STATELESS_NAME.search(function.name):
            continue
        for node in own_nodes(function):
            for target in targets(node):
                for element in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    if isinstance(element, ast.Subscript) and isinstance(element.value, ast.Name):
                        continue  # an item of a local dict (the metrics being built)
                    if any(isinstance(sub, ast.Attribute) for sub in ast.walk(element)):
                        offenders.append(f"{rel}:{node.lineno} {name}: {ast.unparse(element)}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
                offenders.append(f"{rel}:{node.lineno} {name}: setattr")
    assert offenders == []


def test_the_step_counter_and_the_kl_controller_move_in_one_place():
    advances, kl_steps = [], []
    for rel, name, function in functions():
        for node in own_nodes(function):
            if isinstance(node, ast.AugAssign) and ast.unparse(node.target).endswith("state.global_step"):
                advances.append(f"{rel}:{name}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"
                    and ast.unparse(node.func.value).endswith("kl_ctl")):
                kl_steps.append(f"{rel}:{name}")
    assert advances == ["ppo/trainer.py:PPOTrainer.run_update"]
    assert kl_steps == ["ppo/trainer.py:PPOTrainer.run_update"]


def test_the_parent_gets_the_config_unchanged():
    """No config field is swapped around the parent's ``__init__``: the trainer's ``__init__`` assigns no
    ``args.*``."""
    for rel, name, function in functions():
        if rel == "ppo/trainer.py" and name == "PPOTrainer.__init__":
            assert [ast.unparse(t) for node in own_nodes(function) for t in targets(node)
                    if config_or_state(t)] == []
            return
    raise AssertionError("PPOTrainer.__init__ not found")
