"""Format reward of ``grpo_gsm8k.yaml``: one boxed final answer at the end of the response.

A reward function with TRL's ``GRPOTrainer`` contract (``completions`` are chat messages for chat prompts), named in
the recipe as ``gsm8k_rewards.py:boxed_format_reward`` (relative to the recipe's folder).
"""

import re

BOXED = re.compile(r"\\boxed\{[^{}]*\}")


def boxed_format_reward(completions, **kwargs):
    """1.0 when the response holds exactly one ``\\boxed{...}`` and nothing but punctuation or ``$`` after it;
    0.5 for several boxes; 0.0 for none."""
    rewards = []
    for completion in completions:
        text = completion[0]["content"] if isinstance(completion, list) else completion
        boxes = list(BOXED.finditer(text))
        if not boxes:
            rewards.append(0.0)
        elif len(boxes) > 1:
            rewards.append(0.5)
        else:
            rewards.append(1.0 if re.fullmatch(r"[\s.$\\)\]]*", text[boxes[0].end():]) else 0.5)
    return rewards
