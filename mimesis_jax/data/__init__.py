"""Stage I data: tokenizers, the chat template with role spans, role-flip mid-training and ThoughtTrace SFT examples,
packing, and grain pipelines (mixtures, per-host sharding, checkpointable iterator state).

    from mimesis_jax.data import load_tokenizer, render_messages, generation_prompt
    from mimesis_jax.data.pipeline import DataConfig, SourceConfig, make_iterator
"""

from mimesis_jax.data.chat import (ChatFormatError, RenderedChat, generation_prompt, render_messages,
                                   render_turn)
from mimesis_jax.data.tokenizer import Tokenizer, TokenizerError, load_tokenizer

__all__ = ["ChatFormatError", "RenderedChat", "Tokenizer", "TokenizerError", "generation_prompt", "load_tokenizer",
           "render_messages", "render_turn"]
