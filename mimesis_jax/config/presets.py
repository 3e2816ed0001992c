"""Model presets: the paper's backbones (Qwen3.5-4B / 9B simulators, the Qwen3-8B agent) and the tiny CPU models the
tiny configs build from scratch."""

from __future__ import annotations

from mimesis_jax.errors import ConfigError
from mimesis_jax.models.config import ModelConfig


def qwen3_5_layer_types(num_layers: int, interval: int) -> tuple[str, ...]:
    """Every `interval`-th layer full attention, the rest gated DeltaNet (HF Qwen3_5TextConfig's rule)."""
    return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers))


def qwen3_5_model(size: str) -> ModelConfig:
    """Architecture of the paper's simulator backbones (text part), as HF config.json would give it.

    Sources (looked up for this project; re-check against the downloaded config.json, which wins at load time
    because `init.from_hf` refuses a checkpoint whose architecture differs):
    * 9B: transformers 5.x `Qwen3_5TextConfig` defaults, documented there as the "Qwen3.5-9B style
      configuration": hidden 4096, MLP 12288, 32 layers, 16 query / 4 KV heads of 256, gated DeltaNet with
      16 key / 32 value heads of 128, conv kernel 4, untied embeddings, vocab 248,320, partial RoPE 0.25.
    * 4B: the Qwen3.5-4B Megatron preset in THUDM/slime (scripts/models/qwen3.5-4B.sh, checked against the HF
      config by its PR #1721) and public model cards: hidden 2560, MLP 9216, 32 layers, 16 / 4 heads of 256,
      rope theta 1e7, partial RoPE 0.25, vocab 248,320, tied embeddings (no untie flag), an 8 x (3 DeltaNet +
      1 attention) layout (full_attention_interval 4). Its DeltaNet head counts were not found in a primary
      source: the family defaults (16 key / 32 value heads of 128) are assumed.
    """
    common = dict(model_type="qwen3_5_text", vocab_size=248_320, num_hidden_layers=32, num_attention_heads=16,
                  num_key_value_heads=4, head_dim=256, rms_norm_eps=1e-6, rope_theta=10_000_000.0,
                  partial_rotary_factor=0.25, max_position_embeddings=262_144, attn_output_gate=True,
                  full_attention_interval=4, layer_types=qwen3_5_layer_types(32, 4), linear_conv_kernel_dim=4,
                  linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
                  linear_num_value_heads=32, eos_token_id=248_046, bos_token_id=None, pad_token_id=None)
    if size == "4b":
        return ModelConfig(hidden_size=2560, intermediate_size=9216, tie_word_embeddings=True, **common)
    if size == "9b":
        return ModelConfig(hidden_size=4096, intermediate_size=12288, tie_word_embeddings=False, **common)
    raise ConfigError(f"qwen3_5_model: unknown size {size!r} (expected '4b' or '9b')")


def qwen3_model(size: str) -> ModelConfig:
    """Architecture of the paper's agent backbone (Qwen3-8B, paper §4), as its HF config.json gives it: hidden
    4096, MLP 12288, 36 layers, 32 query / 8 KV heads of 128, q/k RMSNorm, rope theta 1e6, untied embeddings,
    vocab 151,936, 40,960 positions, eos <|im_end|> = 151,645. The downloaded config.json wins at load time
    (`init.from_hf` refuses a checkpoint whose architecture differs)."""
    if size != "8b":
        raise ConfigError(f"qwen3_model: unknown size {size!r} (expected '8b')")
    return ModelConfig(model_type="qwen3", vocab_size=151_936, hidden_size=4096, intermediate_size=12288,
                       num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                       rms_norm_eps=1e-6, rope_theta=1_000_000.0, tie_word_embeddings=False,
                       max_position_embeddings=40_960, eos_token_id=151_645, bos_token_id=None, pad_token_id=None)


def tiny_qwen3_5() -> ModelConfig:
    """The tiny simulator of the CPU configs (configs/tiny_*.py): a 4-layer hybrid (3 gated-DeltaNet + 1 gated
    attention layer, hidden 64). vocab_size is replaced by the tokenizer's size (tokenizer.set_model_vocab)."""
    return ModelConfig(model_type="qwen3_5_text", vocab_size=1024, hidden_size=64, intermediate_size=192,
                       num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       partial_rotary_factor=0.25, rope_theta=10_000.0, tie_word_embeddings=True,
                       attn_output_gate=True, full_attention_interval=4, layer_types=qwen3_5_layer_types(4, 4),
                       linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                       linear_num_key_heads=2, linear_num_value_heads=4, max_position_embeddings=4096,
                       logits_seq_chunk=128, logits_vocab_chunk=512)


def tiny_qwen3() -> ModelConfig:
    """The tiny Qwen3 agent of the CPU Stage II configs (configs/tiny_agentrl.py)."""
    return ModelConfig(model_type="qwen3", vocab_size=1024, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       rope_theta=10_000.0, tie_word_embeddings=True, max_position_embeddings=4096,
                       logits_seq_chunk=128, logits_vocab_chunk=512)
