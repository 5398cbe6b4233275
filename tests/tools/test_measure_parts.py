"""tools/measure_parts.py (docs/internals.md, "The PPO trainer's parts, measured") on this checkout: the parts read no
attribute of the trainer, no function of trl_ext/ppo takes the trainer, the trainer imports at most 20 of trl_ext's
modules and has two bases; and the measure itself sees a mixin's reads."""

import ast
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_tool():
    spec = importlib.util.spec_from_file_location("measure_parts_tool", ROOT / "tools" / "measure_parts.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_parts_are_built_from_what_they_read():
    tool = load_tool()
    reads = tool.part_reads(ROOT / "trl_ext")
    assert set(reads) == set(tool.PARTS)  # every part found
    assert {part: r["attributes"] for part, r in reads.items()} == {part: [] for part in tool.PARTS}
    assert tool.trainer_taking_functions(ROOT / "trl_ext") == []
    assert len(tool.trainer_imports(ROOT / "trl_ext")) <= 20


def test_the_trainer_has_the_parent_and_one_mixin():
    import trl_ext
    from trl_ext.ppo.base.parent_fixes import PPOParent
    from trl_ext.runtime.checkpoints import AtomicCheckpointMixin

    assert trl_ext.PPOTrainer.__bases__ == (AtomicCheckpointMixin, PPOParent)


def test_a_mixin_reading_the_trainer_is_counted():
    tool = load_tool()
    cls = ast.parse("class M:\n    x = 1\n    def f(self):\n        self.y = self.state.step + self.x\n"
                    "        return self.y + self.args.n + self.g()\n    def g(self):\n        return 0\n").body[0]
    assert tool._class_reads(cls) == {"state", "args"}
