"""Regenerate the demo's small datasets (deterministic): `python recipes/demo/make_data.py`.

The toy preference: responses with "happy" words (good, great, happy, ...) beat responses without them. The reward
demo learns it, the DPO demo learns it directly, and the PPO demo's policy learns to say those words.
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).parent / "data"
POSITIVE = "good great happy kind helpful wonderful lovely nice bright".split()
NEGATIVE = "bad terrible sad rude useless awful".split()
NEUTRAL = ("the a cat dog bird fish tree sun moon star sky sea river mountain city road house garden book story "
           "is was and one two red blue green small big day night water music song").split()
TOPICS = "cat dog bird fish tree sun moon sea river mountain city garden book song music day night".split()
ASKS = ["tell me about the {}", "write a story about the {}", "what do you think of the {}", "say something about the {}"]


def sentence(rng, n_pos, n_neg):
    words = [rng.choice(NEUTRAL) for _ in range(rng.randint(4, 8))]
    for w in [rng.choice(POSITIVE) for _ in range(n_pos)] + [rng.choice(NEGATIVE) for _ in range(n_neg)]:
        words.insert(rng.randrange(len(words) + 1), w)
    return " ".join(words)


def pairs(rng, n):
    rows = []
    for _ in range(n):
        prompt = rng.choice(ASKS).format(rng.choice(TOPICS))
        chosen = sentence(rng, rng.randint(1, 3), 0)
        rejected = sentence(rng, 0, rng.randint(0, 2))
        rows.append({"prompt": prompt, "chosen": " " + chosen, "rejected": " " + rejected})
    return rows


def write(name, rows):
    with open(HERE / name, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    rng = random.Random(0)
    HERE.mkdir(exist_ok=True)
    write("preferences.jsonl", pairs(rng, 256))
    write("prompts.jsonl", [{"prompt": a.format(t)} for a in ASKS for t in TOPICS])
