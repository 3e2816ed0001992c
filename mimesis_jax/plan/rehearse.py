"""Rehearsal configs: a paper config at tiny width but with the paper's structure, for `python -m mimesis_jax
rehearse` (commands/rehearse.py) to run 1-2 RL steps of on a CPU's fake devices.

`narrow_config(cfg)` keeps what decides which programs a run compiles and how they are sharded, and shrinks what
only sets their size:

kept exactly
* the mesh (axes and sizes: 16 devices for the paper RL configs), the model type, the layer-type pattern: the
  shortest repeating block of the paper's `layer_types` (its period), repeated `repeats` times -- by default the
  fewest whole periods that make at least two layers: Qwen3's one-layer period twice, Qwen3.5's (3 DeltaNet + 1
  attention) once. One period holds every layer kind and its order, and the layers run as a `lax.scan` over the
  repeats of that block (models/qwen3_5.py), so a second period compiles nothing new: it only doubles the run's
  cost (the 9B simrl rehearsal's update and sampler); two layers at least keep the scan's carry between layers;
  tied / untied embeddings, attention implementation, remat, compute dtype, partial RoPE;
* the GQA ratio (query : KV heads) and the DeltaNet key : value head ratio, with every head count, the MLP width
  and the vocabulary a multiple of the tensor axis (the larger of the mesh's and `rollout.mesh`'s);
* group size, batch / mini-batch ratio (updates per step), micro-batches, the rollout's sampler-call ratio
  (rollout.max_batch / rollout batch), max turns, CSD (rl.*: alpha, beta, teacher, credit), optimizer kind;
* the token budgets' relations: every budget (prompt, context, row, per-turn, coach note, simulator turn) is the
  paper's divided by the same `tokens` factor, so row_len == max_context_tokens stays (Stage II) and
  context = prompt + response does; except that Stage II's prompt budget is at least `TOY_PROMPT_TOKENS` (the toy
  tasks' prompts must pass its filter), the context and the row growing by as much, so both relations hold at
  `--tokens 32` (prompt 72, response 8,192 / 32, context = row = 328);

narrowed
* widths: hidden `width`, head dim 16, MLP at the paper's intermediate / hidden ratio, 2 KV heads per tensor
  shard... (see `narrow_model`); attention blocks / `tokens`, log-prob chunks / `tokens` but >= 64 tokens
  (`MIN_LOGPROB_CHUNK`); the tiny tokenizer and its vocabulary (model.vocab_size := its size rounded up);
* prompts per step: the paper's / `batch` (the mini-batch shrinks with it);
* the sides: Stage II's user, judge and coach are the rule-based toy user and coach on `toy:N:s:turns`
  ToyKeyword tasks with the paper's turn limit (envs/toy.py); Stage I.3 draws two single-turn judged SOUL
  domains and a multi-turn one (`SIM_DOMAINS`) with the toy judge, and the toy support agent as the support agent
  and the multi-turn domain's partner, and samples without thinking
  (rollout.thinking = False: a random-init policy never closes its thought with `</think>`, one token of 1,024,
  so it would never reply and every reward would be 0; the programs are the same, the sampler's shapes fixed by
  the token budgets); nothing is served or read from disk;
* train.steps, no validation, no checkpoint (commands/rehearse.py builds the learner with save_checkpoints=False);
  rollout.engine_memory_gib = 0 (no cap: the tiny engine's whole pool is small).
"""

from __future__ import annotations

import dataclasses
import math

from mimesis_jax.config import TokenizerConfig
from mimesis_jax.errors import ConfigError
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.models.qwen3_5 import layer_block
from mimesis_jax.config.layout import rollout_layout

HEAD_DIM = 16
# the memory-safe log-prob path's token chunk (model.logits_seq_chunk): the paper's 256 / 16 = 16 tokens would make
# the 9B simrl update a 64-step loop per 1,024-token row; 64 tokens compile quicker and leave its compiled bytes and
# the plan's as they are (the chunk's [chunk, vocab chunk] logits are small next to the activations)
MIN_LOGPROB_CHUNK = 64
TOY_TASKS = 64
# the toy tasks' prompts are 58-64 tiny tokens (system + user turn, rendered): the paper's 1,152 / 16
TOY_PROMPT_TOKENS = 72
# Stage I.3's rehearsal domains: judged ones whose rewards the toy judge grades for any reply (envs/toy.py
# ToyBehaviourJudge: by the replies' length against the real ones), so a random-init policy gets rewards that
# differ within a group and its update moves the weights. Two single-turn Humanual domains, whose prompts in the
# tiny tokenizer (460-560 tokens) leave room for a turn in the 1,024-token context of the paper's 16,384 / 16, and
# the multi-turn MirrorBench (2-4 policy turns per record, the toy support agent as its partner): its openings
# are 230-260 tiny tokens and each turn adds the reply and the partner's answer, so a random policy's 128-token
# turns all fit that context (at --tokens 32, 512 tokens and 64-token turns, only MirrorBench fits; at 64 none).
# With the uniform weights and seed 0 each of the two steps draws MirrorBench at least once. The choice domains
# (hitom, social_r1...) score a random policy 0 (it never writes an option letter in <answer> tags), and
# abcd_behaviour's opening prompts are 1,100-1,400 tiny tokens: it gets no policy turn at that context.
SIM_DOMAINS = (("humanual_chat", 1.0), ("humanual_opinion", 1.0), ("mirrorbench", 1.0))


def _multiple(n: float, m: int) -> int:
    """n rounded up to a positive multiple of m."""
    return max(m, -(-int(math.ceil(n)) // m) * m)


def narrow_model(model: ModelConfig, tensor: int, *, width: int = 64, repeats: int | None = None,
                 tokens: int = 16) -> ModelConfig:
    """The paper model at hidden size `width`, its structure kept (module docstring). `tensor`: the mesh's tensor
    axis; `repeats`: of the layer pattern's period (default: the fewest making >= 2 layers); `tokens`: the factor
    the token budgets shrink by (attention blocks and log-prob chunks shrink with them)."""
    if model.num_attention_heads % model.num_key_value_heads:
        raise ConfigError(f"model: {model.num_attention_heads} heads are not a multiple of "
                          f"{model.num_key_value_heads} KV heads")
    ratio = model.num_attention_heads // model.num_key_value_heads
    kv = tensor  # the fewest KV heads the tensor axis splits
    block, _ = layer_block(model)
    if repeats is None:
        repeats = -(-2 // len(block))
    if repeats < 1:
        raise ConfigError(f"rehearse: --repeats {repeats}: must be >= 1")
    layers = block * repeats
    kw = dict(hidden_size=width, num_attention_heads=ratio * kv, num_key_value_heads=kv, head_dim=HEAD_DIM,
              intermediate_size=_multiple(width * model.intermediate_size / model.hidden_size, 8 * tensor),
              num_hidden_layers=len(layers), vocab_size=1024, eos_token_id=None, bos_token_id=None,
              pad_token_id=None, max_position_embeddings=max(4096, model.max_position_embeddings // tokens),
              attention_block_q=max(16, model.attention_block_q // tokens),
              attention_block_k=max(16, model.attention_block_k // tokens),
              logits_seq_chunk=max(MIN_LOGPROB_CHUNK, model.logits_seq_chunk // tokens), logits_vocab_chunk=512)
    if model.layer_types:
        kw["layer_types"] = tuple(layers)
    if model.model_type == "qwen3_5_text":
        hk, hv = model.linear_num_key_heads, model.linear_num_value_heads
        if hv % hk:
            raise ConfigError(f"model: {hv} DeltaNet value heads are not a multiple of {hk} key heads")
        kw.update(linear_num_key_heads=tensor, linear_num_value_heads=tensor * (hv // hk),
                  linear_key_head_dim=HEAD_DIM, linear_value_head_dim=HEAD_DIM)
    return model.replace(**kw)


def _scale(n: int, tokens: int) -> int:
    return max(1, n // tokens) if n else 0


def _rollout(r, tokens: int, prompts: int, turn_key: str, extra: int = 0):
    """The rollout section with the token budgets / `tokens` (context and row + `extra`), `prompts` prompts per
    step and the paper's batch / mini-batch and sampler-call ratios."""
    updates = r.prompts_per_step // r.mini_batch_prompts
    if r.prompts_per_step % r.mini_batch_prompts or prompts % updates:
        raise ConfigError(f"rehearse: {prompts} prompts per step cannot keep the config's {updates} updates per step "
                          f"(rollout.prompts_per_step={r.prompts_per_step}, mini_batch_prompts={r.mini_batch_prompts})")
    batch = r.prompts_per_step * r.group_size
    new_batch = prompts * r.group_size
    max_batch = max(1, r.max_batch * new_batch // batch) if r.max_batch else 0
    return dataclasses.replace(r, prompts_per_step=prompts, mini_batch_prompts=prompts // updates,
                               max_context_tokens=_scale(r.max_context_tokens, tokens) + extra,
                               row_len=_scale(r.row_len, tokens) + extra if r.row_len else 0,
                               max_batch=max_batch, env_workers=1,
                               engine_memory_gib=0.0,
                               **{turn_key: _scale(getattr(r, turn_key), tokens)})


def narrow_config(cfg, *, width: int = 64, repeats: int | None = None, tokens: int = 16, batch: int = 16,
                  steps: int = 1):
    """A rehearsal of the AgentRLConfig / SimRLConfig `cfg` (module docstring): widths narrowed to `width`, token
    budgets / `tokens`, prompts per step / `batch`, `steps` steps; the structure kept."""
    r = cfg.rollout
    if r.prompts_per_step % batch:
        raise ConfigError(f"rehearse: rollout.prompts_per_step={r.prompts_per_step} is not a multiple of --batch "
                          f"{batch}")
    tensor = cfg.mesh.tensor if cfg.mesh.tensor > 0 else 1
    layout = rollout_layout(r.mesh)  # a rollout layout's tensor axis splits the heads too (rollout.mesh)
    tensor = max(tensor, layout["tensor"] if layout else 1)
    model = narrow_model(cfg.model, tensor, width=width, repeats=repeats, tokens=tokens)
    tok = TokenizerConfig(name="tiny", set_model_vocab=True, vocab_multiple=64 * tensor)
    prompts = r.prompts_per_step // batch
    common = dict(name=f"{cfg.name}_rehearse", model=model, tokenizer=tok, init=type(cfg.init)(),
                  train=dataclasses.replace(cfg.train, steps=steps, progress_bar=False, tensorboard=False),
                  checkpoint=dataclasses.replace(cfg.checkpoint, every=steps, keep=1, async_save=False),
                  validation=type(cfg.validation)(), optimizer=dataclasses.replace(
                      cfg.optimizer, warmup_steps=min(cfg.optimizer.warmup_steps, steps)))
    if hasattr(cfg, "users"):  # Stage II
        u = cfg.users
        users = dataclasses.replace(u, simulator="toy-user", simulator_model="", simulator_style="", key_env="",
                                    judge="", judge_model="", coach="toy-coach", coach_model="",
                                    simulator_max_tokens=_scale(u.simulator_max_tokens, tokens),
                                    coach_max_tokens=_scale(u.coach_max_tokens, tokens))
        g = cfg.gyms
        prompt = _scale(g.max_prompt_tokens, tokens)
        extra = max(0, TOY_PROMPT_TOKENS - prompt) if prompt else 0
        gyms = dataclasses.replace(g, sources=(f"toy:{TOY_TASKS}:s:{g.max_turns}",), weights=(), gyms=(),
                                   max_prompt_tokens=prompt + extra)
        out = cfg.replace(users=users, gyms=gyms, rollout=_rollout(r, tokens, prompts, "agent_max_tokens", extra),
                          **common)
    else:  # Stage I.3
        sides = dataclasses.replace(cfg.sides, judge="toy-judge", judge_model="", support_agent="toy-agent",
                                    support_agent_model="", partner="toy-agent", partner_model="", key_env="",
                                    max_tokens=_scale(cfg.sides.max_tokens, tokens))
        domains = dataclasses.replace(cfg.domains, weights=SIM_DOMAINS, sources=())
        rollout = dataclasses.replace(_rollout(r, tokens, prompts, "max_tokens"), thinking=False)
        out = cfg.replace(sides=sides, domains=domains, rollout=rollout, **common)
    return out.validate()
