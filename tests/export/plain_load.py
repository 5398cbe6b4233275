"""Load exported models with plain transformers only (peft, trl and trl_ext made unimportable) and write their
outputs on the given token ids: what a user without trl-ext gets. Usage: plain_load.py SPEC.json OUT.json"""

import json
import sys

for name in ("peft", "trl", "trl_ext"):
    sys.modules[name] = None  # `import peft` now raises ImportError

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification  # noqa: E402

spec = json.loads(open(sys.argv[1]).read())
input_ids = torch.tensor(spec["input_ids"])
attention_mask = torch.tensor(spec["attention_mask"])
results = {}
for name, entry in spec["models"].items():
    cls = AutoModelForSequenceClassification if entry["scalar"] else AutoModelForCausalLM
    model = cls.from_pretrained(entry["dir"], trust_remote_code=entry.get("trust_remote_code", False)).eval()
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    results[name] = {"logits": logits.float().tolist(), "class": type(model).__name__,
                     "dtype": str(next(model.parameters()).dtype),
                     "bias": None if not entry["scalar"] or model.score.bias is None else model.score.bias.item()}
open(sys.argv[2], "w").write(json.dumps(results))
