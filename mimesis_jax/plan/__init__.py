"""Memory planner: does a run config fit its mesh, per device, before any device is touched?

    python -m mimesis_jax plan --config configs/mimesis_sft.py:9b --device a100-80g
    python -m mimesis_jax plan --config configs/qwen3_8b_agentrl.py:csd --mesh data=1,fsdp=16,tensor=1 --device h200

The mesh defaults to the config's own (`mesh.*`; an axis of -1 absorbs the devices this process sees). The
number of devices is the mesh product and they need not exist: the plan is shapes and arithmetic.

Per device, for RunConfig (mid-training / SFT), AgentRLConfig (Stage II GRPO + CSD) and SimRLConfig (Stage I
joint RL):

* **exact, by abstract evaluation**: parameters (fp32 master weights), gradients (fp32, split like the parameters;
  two buffers where micro-batch gradients are summed into an accumulator: train.grad_accum > 1 and every RL
  update) and the optimizer state (`jax.eval_shape` of the run's optax chain: AdamW's two moments split like
  their parameter, step counts replicated). A leaf's bytes per device = global bytes / the product of the mesh
  axes its dims are split over (`sharding.logical_to_spec`: the trainer's rules and divisibility fall-back).
* **activations, by formula** (`layer_residuals`, per layer type, b = micro-batch rows on one device, T = row
  length, head / MLP / vocabulary widths after the tensor split). The remat policy picks what a layer keeps for
  the backward: none = its whole tensor table, dots = the matmul outputs, dots_no_batch = those without batch
  dims (not the attention scores), full = its input only (b T D in the compute dtype). The backward of a layer
  then holds that table again (recomputed under remat, sliced copies without), the cotangents (compute dtype), the
  attention backward (dense: fp32 [b,H,T,T] scores; blockwise: [b,H,bq,bk] blocks) and its fp32 weight
  gradient (plus its weights gathered over fsdp). `layer_backward_phase` says which saved stacks are live then.
* the chunked log-prob head (algorithms/logprobs.py) and the [V, D] embedding / head tables gathered over fsdp,
  with their fp32 gradients (the layer backward runs beside two dense fp32 [V, D] gradient buffers, the
  scatter-adds of the head's target-row gather and of the embedding lookup, the LM train step's also beside the
  gathered tables);
* the CSD teacher branches (Stage II with rl.alpha > 0): Tb branch tokens per trunk row, one no-gradient layer
  forward at a time (nothing saved), attending the trunk and branch keys;
* the rollout phase (RL configs): the sampler's KV cache and, for Qwen3.5, the DeltaNet state and conv window
  (`init_cache` shapes placed by `cache_axes`) for one sampler call -- rollout.max_batch sequences (0: the whole
  rollout batch, prompts_per_step x group_size), bucketed, at the longest context -- one prefill layer's working
  set and the logits, next to the parameters and optimizer state (resident while the policy samples). Chunked
  calls run one after another, so only one chunk's cache is live. With rollout.engine=true instead: the engine
  on the training mesh -- the learner's parameters (no copy on one process), its page pool split over KV heads,
  and the larger of a prefill chunk (one layer over the rows' gathered pages, with the layers' weight shards and
  the gathered LM head the CPU program copies; every layer's weights and the [V, D] tables gathered over fsdp
  where the rows split over fsdp) and a decode burst's slot-major copy of its rows' pages.
  `--processes N` adds, per process, its own parameter copy over its sub-mesh and its share of the tasks.

RL row counts depend on the data; the default is the worst case Stage II allows (every dialogue fills a row of
rollout.row_len tokens) and one row per rollout for Stage I's joint RL (a rollout's segments pack into one row);
`--rows` overrides it. With a shape ladder (Stage II with rollout.row_len set) every update shape is the ladder's
top rung (`workload.ladder_top`: rows, row length, LM-head positions = the whole row, CSD branch and branch-head
lengths), the largest program the loop compiles.

The peak is the larger of the train step and the rollout phase, compared with the device's memory less `HEADROOM`
(`budget.verdict`): FITS when the margin is at least the planner's error on that peak, `budget.error_bytes` =
peak / (1 - e) - peak, the most a compiled program can exceed its plan when planned / compiled is within e of 1;
e is plan/compiled.py TOLERANCE, the bound the tests hold every planned program to, or with `--compiled` 1 - the
compiled programs' smallest ratio when that is larger (`checked_error` of commands/plan.py; the output names the e
it used).
TIGHT when the peak fits but within that error, DOES NOT FIT when it does not fit at all; the per-process rollout
of `--processes N` gets the same verdict. Unless it FITS, `suggest` re-plans single changes and pairs of them
(remat full, data or tensor folded into fsdp, more micro-batches, fewer sequences per sampler call
(rollout.max_batch), shorter rows, more fsdp devices) and reports the cheapest that FITS (costs in `_knobs`).

The formulas were checked against XLA's compiled memory analysis (`profiling.memory_bytes`: arguments + results -
aliased + scratch) of the LM train step, the RL step and the sampler on fake-device CPU meshes
(tests/test_plan.py): within 10% (TOLERANCE) for no remat, full remat and dots, dense and blockwise attention, Qwen3
and Qwen3.5, with and without CSD branches; every program of the paper configs at their own widths on their meshes
(tests/test_plan_compiled.py) and of their rehearsals (tests/test_rehearse.py) too; two tiny configs' programs within
15% (test_plan.py TINY_TOLERANCE says which and why). CPU XLA keeps some bf16 intermediates in fp32, so bf16 programs compile
larger there than this (GPU-minded) count; on GPU/TPU the fusions differ in detail: read the margin accordingly.
"""
