"""Make other libraries' models rotate with anyrope.

Each submodule imports its library only when imported itself, so ``import anyrope`` stays
free of them: :mod:`anyrope.integrations.transformers` for Hugging Face transformers models,
:mod:`anyrope.integrations.mlx_lm` for mlx-lm models.
"""
