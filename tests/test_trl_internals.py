"""TRL's internals in one module (trl_ext/trl_internals.py): each name imports on the installed TRL (checked on TRL
1.12.0 and 1.16.0, the two the suite runs with), a missing one fails with one line naming it, the copies equal TRL's
on random inputs, and no other module of trl_ext imports TRL beyond its public top level."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import torch
from packaging.version import Version

import trl_ext.trl_internals as internals

PACKAGE = Path(__file__).resolve().parents[1] / "trl_ext"
TRL = Version(importlib.import_module("trl").__version__)


def test_the_versions_named_are_the_ones_the_suite_runs_with():
    assert internals.CHECKED_ON == ("1.12.0", "1.16.0")


@pytest.mark.parametrize("name", sorted(internals.FROM_TRL))
def test_each_name_imports_from_the_installed_trl(name):
    module, attr = internals.FROM_TRL[name]
    if name in internals.UNTIL_1_12 and TRL >= Version("1.13"):
        with pytest.raises(internals.MovedInTRL, match=f"^trl-ext needs {module}.{attr}, which TRL {TRL} does not"):
            getattr(internals, name)
        return
    assert getattr(internals, name) is getattr(importlib.import_module(module), attr)


def test_a_name_a_trl_release_moved_fails_naming_it(monkeypatch):
    monkeypatch.setitem(internals.FROM_TRL, "pad_moved", ("trl.trainer.utils", "pad_moved"))
    monkeypatch.setitem(internals.FROM_TRL, "gone", ("trl.no_such_module", "gone"))
    with pytest.raises(ImportError, match=r"^trl-ext needs trl\.trainer\.utils\.pad_moved, which TRL .* was checked on "
                                          r"TRL 1\.12\.0 and 1\.16\.0"):
        from trl_ext.trl_internals import pad_moved  # noqa: F401
    with pytest.raises(internals.MovedInTRL, match=r"^trl-ext needs trl\.no_such_module\.gone, .*No module named"):
        internals.gone
    with pytest.raises(AttributeError):
        internals.not_a_trl_name


def test_the_chat_template_trl_ships_is_there():
    assert "tool_call" in internals.trl_chat_template("qwen2_5.jinja")


def test_no_other_module_imports_trl_beyond_its_top_level():
    """`from trl import X` (TRL's public names) is fine anywhere; anything deeper goes through trl_internals."""
    deeper = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "trl_internals.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            deeper += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {n}" for n in names if n.startswith("trl.")]
    assert deeper == []


# ------------------------------------------------------------------ the copies against TRL's own


def random_tensors(g, ndim):
    n = int(torch.randint(1, 5, (), generator=g))
    return [torch.randint(0, 100, tuple(int(torch.randint(1, 6, (), generator=g)) for _ in range(ndim)), generator=g)
            for _ in range(n)]


@pytest.mark.parametrize("seed", range(6))
def test_pad_is_trls(seed):
    from trl.trainer.utils import pad

    g = torch.Generator().manual_seed(seed)
    for ndim in (1, 2, 3):
        tensors = random_tensors(g, ndim)
        for kwargs in ({}, {"padding_value": -1, "padding_side": "left"}, {"pad_to_multiple_of": 4},
                       {"padding_side": "left", "pad_to_multiple_of": 3, "padding_value": 7}):
            ours, theirs = internals.pad(tensors, **kwargs), pad(tensors, **kwargs)
            assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)
    with pytest.raises(ValueError, match="padding_side"):
        internals.pad(tensors, padding_side="middle")


@pytest.mark.parametrize("seed", range(6))
def test_nanstd_is_trls(seed):
    from trl.trainer.utils import nanstd

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 3, 5, generator=g)
    x[torch.rand(x.shape, generator=g) < 0.3] = float("nan")
    x[0, 0] = float("nan")  # a row with no value, one with one
    x[1, 1, 1:] = float("nan")
    for dim in (None, 0, -1, (0, 2), (-1, 1)):
        for keepdim in (False, True):
            ours, theirs = internals.nanstd(x, dim, keepdim), nanstd(x, dim, keepdim)
            assert ours.shape == theirs.shape and torch.equal(ours.isnan(), theirs.isnan())
            assert torch.equal(ours.nan_to_num(), theirs.nan_to_num())


def test_dropout_config_and_column_helpers_are_trls():
    from datasets import Dataset, IterableDataset
    from transformers import PretrainedConfig
    from trl.data_utils import get_dataset_column_names
    from trl.trainer.utils import disable_dropout_in_model, get_config_model_id

    def model():
        return torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.3),
                                   torch.nn.Sequential(torch.nn.Dropout(0.1), torch.nn.Dropout1d(0.2)))

    ours, theirs = model(), model()
    internals.disable_dropout_in_model(ours)
    disable_dropout_in_model(theirs)
    assert [getattr(m, "p", None) for m in ours.modules()] == [getattr(m, "p", None) for m in theirs.modules()]
    assert [m.p for m in ours.modules() if isinstance(m, torch.nn.Dropout)] == [0, 0]
    for config in (PretrainedConfig(name_or_path="org/model"), PretrainedConfig(), object()):
        assert internals.get_config_model_id(config) == get_config_model_id(config)
    data = Dataset.from_dict({"prompt": ["a", "b"], "answer": [1, 2]})
    unknown = IterableDataset.from_generator(lambda: iter([{"text": "x", "id": 0}]))  # column_names None
    assert unknown.column_names is None
    for dataset in (data, data.to_iterable_dataset(), unknown):
        assert internals.get_dataset_column_names(dataset) == get_dataset_column_names(dataset)
