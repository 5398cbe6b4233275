"""The recipe loader and pipeline behind the ``trl-ext`` command: from one YAML file (the top-level ``recipes/``
folder holds the shipped ones) to a trained model. Named ``recipe_loader`` so that the package and the folder of YAML
files are not both ``recipes``. How it works: docs/internals-recipes.md#the-recipe-loader."""

from .loader import Recipe, resolve_recipe, valid_keys

__all__ = ["Recipe", "resolve_recipe", "valid_keys"]
