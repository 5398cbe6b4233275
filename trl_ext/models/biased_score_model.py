"""Loads a sequence-classification model whose score head was given a bias by reward centering. How it works:
docs/internals.md#biased-score-model."""

import os
import shutil

import torch.nn as nn
from transformers import PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING

AUTO_MAP = {"AutoModelForSequenceClassification": "biased_score_model.BiasedScoreForSequenceClassification"}

_BIASED_CLASSES = {}


def biased_score_class(base_class):
    """`base_class` (a sequence-classification class with a `score` Linear) with a biased score head."""
    if base_class not in _BIASED_CLASSES:

        def __init__(self, config):
            base_class.__init__(self, config)
            head = self.score
            self.score = nn.Linear(
                head.in_features, head.out_features, bias=True, device=head.weight.device, dtype=head.weight.dtype
            )
            nn.init.zeros_(self.score.bias)

        def save_pretrained(self, save_directory, *args, **kwargs):
            """Save as `base_class` does, plus this file and the `auto_map` entry that loads it."""
            self.config.auto_map = dict(AUTO_MAP)
            base_class.save_pretrained(self, save_directory, *args, **kwargs)
            if kwargs.get("is_main_process", True):
                shutil.copyfile(__file__, os.path.join(save_directory, "biased_score_model.py"))

        _BIASED_CLASSES[base_class] = type(
            f"BiasedScore{base_class.__name__}",
            (base_class,),
            {"__init__": __init__, "save_pretrained": save_pretrained, "__module__": __name__},
        )
    return _BIASED_CLASSES[base_class]


class BiasedScoreForSequenceClassification(PreTrainedModel):
    """Entry point named in `auto_map`: dispatches to the config's own class, with a biased score head."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, config=None, **kwargs):
        base_class = MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING[type(config)]
        kwargs.pop("trust_remote_code", None)
        return biased_score_class(base_class).from_pretrained(
            pretrained_model_name_or_path, *model_args, config=config, **kwargs
        )

    @classmethod
    def _from_config(cls, config, **kwargs):
        base_class = MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING[type(config)]
        return biased_score_class(base_class)._from_config(config, **kwargs)
