"""The FoX paper's two families: ``transformer`` (LLaMA or Pro blocks with plain causal softmax
attention, the baselines) and ``fox`` (the same blocks with Forgetting Attention). Both are the
``DecoderLM`` module; they differ only in their config's forget gate."""

from .decoder import DecoderLM, init_cache
from .table import register
from .fox_config import FoXConfig, TransformerConfig
from .language_model import language_model_family


register(language_model_family(
    "transformer", TransformerConfig, DecoderLM, init_cache=init_cache, context_parallel=True,
    past_training_length=("with RoPE its MQAR recall fell from 100 % to 98 % at 2x and 89 % at 4x the training "
                          "length (Pro block, 3 seeds), and its loss on held-out books rose past it "
                          "(docs/mechanisms.md, docs/evaluation.md)")))
register(language_model_family(
    "fox", FoXConfig, DecoderLM, init_cache=init_cache, context_parallel=True,
    past_training_length=("its MQAR recall stayed at 100 % at 2x and 4x the training length (Pro block, 3 "
                          "seeds) and its loss on held-out books stayed level to 4x (docs/mechanisms.md, "
                          "docs/evaluation.md)")))
