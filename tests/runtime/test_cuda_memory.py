"""CUDA's caching allocator settings (trl_ext.runtime.cuda_memory), decided on CPU: the device is an argument."""

import os

import pytest

from trl_ext.runtime.cuda_memory import ALLOC_CONF_ENV, allocator_setting, configure_cuda_allocator


def test_cuda_runs_get_expandable_segments_unless_the_user_or_the_recipe_says_otherwise():
    value, message = allocator_setting("cuda", None, True)
    assert value == "expandable_segments:True" and "set by trl-ext" in message
    assert allocator_setting("cuda", "max_split_size_mb:128", True) == (
        None, f"{ALLOC_CONF_ENV}=max_split_size_mb:128 (the user's; kept)")
    assert allocator_setting("cuda", None, False)[0] is None
    assert allocator_setting("cpu", None, True)[0] is None


def test_configure_sets_the_variable_for_cuda_only(monkeypatch):
    monkeypatch.delenv(ALLOC_CONF_ENV, raising=False)
    assert configure_cuda_allocator(True, device_type="cpu") is None and ALLOC_CONF_ENV not in os.environ
    assert configure_cuda_allocator(False, device_type="cuda") is None and ALLOC_CONF_ENV not in os.environ
    # no CUDA here: torch.cuda is not initialised, so only the variable is set
    assert configure_cuda_allocator(None, device_type="cuda") == "expandable_segments:True"
    assert os.environ[ALLOC_CONF_ENV] == "expandable_segments:True"
    monkeypatch.setenv(ALLOC_CONF_ENV, "expandable_segments:False")
    assert configure_cuda_allocator(True, device_type="cuda") is None
    assert os.environ[ALLOC_CONF_ENV] == "expandable_segments:False"


@pytest.mark.parametrize("value", ["true", "false"])
def test_recipe_key(value, tmp_path):
    from trl_ext.recipe_loader.loader import resolve_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"trainer: sft\nmodel_name_or_path: tiny://policy\ndataset_name: {tmp_path}/d.jsonl\n"
                      f"output_dir: {tmp_path}/out\nuse_cpu: true\ncuda_expandable_segments: {value}\n")
    (tmp_path / "d.jsonl").write_text('{"text": "a b"}\n')
    assert resolve_recipe(recipe).pipeline.cuda_expandable_segments is (value == "true")
