"""Loading models from a ``trl.ModelConfig``: tokenizer, policy and scalar-headed (reward/value) models.

* ``loaders.py``: :func:`load_tokenizer`, :func:`load_policy`, :func:`load_scalar_model` (re-exported here), with
  every user-input check done before weights load.
* ``quantization.py``: bitsandbytes 4/8-bit configs and the CPU fix for silently wrong 4-bit LoRA gradients.
* ``lora.py``: LoRA configs through TRL's ``get_peft_config``, with target-module checks.
* ``scalar_heads.py``: per-token outputs of reward/value models, plain or PEFT-wrapped (used by PPO's scoring).
* ``shared_base.py``: reward and value models as LoRA adapters with their own score heads on the policy's base
  (one base for policy, reference, reward and value), with an adapter switch that survives activation
  checkpointing.
* ``biased_score_model.py``: the self-contained loader a centred reward checkpoint ships with.
* ``paths.py``: the one rule for "local path or Hub id", shared with the recipe checks.
* ``dtypes.py``: which dtype each parameter has (the rule, tested for every trainer), peft's k-bit preparation
  without its float32 upcast (``upcast_non_quantized: false``), and keeping loaded dtypes through TRL's trainers.
* ``positions.py``: positions in padded token sequences (``first_true_indices``), for the heads and PPO.

Nothing here imports :mod:`trl_ext.ppo` or the other trainer packages.

The trainers (:mod:`trl_ext.ppo`, :mod:`trl_ext.preference`) take models loaded here or anywhere else; the recipe
pipeline (:mod:`trl_ext.recipe_loader`) loads them here.
"""

from .loaders import load_policy, load_scalar_model, load_tokenizer, score_head_name, set_pad_token

__all__ = ["load_policy", "load_scalar_model", "load_tokenizer", "score_head_name", "set_pad_token"]
