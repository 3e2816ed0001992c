"""The custom RL loop of docs/api.md, run as written (the block is read from the markdown, so the page and the test
cannot drift apart), and the update's layouts: it takes params and optimizer state as it returns them, so a loop
compiles it once whatever layout its first params came in."""

import pathlib
import re

import jax
import numpy as np
import optax
import pytest

from rl_helpers import random_batch, tiny_config
from mimesis_jax import models, sharding
from mimesis_jax.profiling import count_compilations
from mimesis_jax.train.rl.step import RLConfig, make_rl_step, prepare_batch

API = pathlib.Path(__file__).resolve().parents[1] / "docs" / "api.md"


def _loop_source() -> str:
    """The python block under docs/api.md's heading 'A custom RL loop'."""
    text = API.read_text()
    section = text[text.index("## A custom RL loop"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_api_loop_runs_compiles_the_update_once_and_applies_sgd(capsys):
    """The page's loop: 3 steps, one update program (jax's compile events and RLStep.num_compilations); a 4th step
    on its objects compiles nothing, its loss is Eq 6 at rho = 1 (pi_old was scored with the same params), -sum of
    advantage x token weight, and with SGD it moves the params by exactly -lr x the accumulated gradient."""
    ns = {"__name__": "api_loop"}
    with count_compilations() as compiled:
        exec(compile(_loop_source(), str(API), "exec"), ns)
    step, rl = ns["step"], ns["rl"]
    assert compiled.count_of("_rl_update") == 1 and step.num_compilations == 1
    out = capsys.readouterr().out
    assert "update programs compiled: 1" in out and out.count("step ") == 3, out

    packed = prepare_batch([ns["episode"](g, 8 + 4 * g + i) for g in range(2) for i in range(4)], rl,
                           rows_multiple=step.rows_multiple(), row_len=32, num_rows=8)
    batch = step.recompute_old_logprobs(ns["params"], step.place(packed))
    loss, grads, _ = step.loss_and_grads(ns["params"], batch)
    before = jax.tree.map(np.asarray, ns["params"])
    params, _, m = step(ns["params"], ns["opt_state"], batch)
    assert step.num_compilations == 1  # the state the 3rd step returned is laid out as the update takes it
    objective = -float(np.sum(np.asarray(batch["advantages"], np.float64) * np.asarray(batch["grpo_weight"])))
    scale = float(np.sum(np.abs(np.asarray(batch["advantages"]) * np.asarray(batch["grpo_weight"]))))
    assert scale > 0 and abs(float(m["loss"]) - objective) <= 1e-5 * scale
    assert float(m["loss"]) == pytest.approx(float(loss), rel=1e-6, abs=1e-7)
    lr = np.float32(0.1)  # optax.sgd(0.1) in the page: new = old - lr x gradient, to the rounding of the weights
    for old, new, g in zip(jax.tree.leaves(before), jax.tree.leaves(params), jax.tree.leaves(grads)):
        g = np.asarray(g)
        bound = 2 * np.spacing(np.abs(old)) + 1e-5 * lr * np.abs(g).max()
        assert np.all(np.abs(np.asarray(new) - (old - lr * g)) <= bound)
    assert max(float(np.abs(np.asarray(g)).max()) for g in jax.tree.leaves(grads)) > 0


@pytest.mark.parametrize("mesh_axes", [None, {"fsdp": 4, "tensor": 2}], ids=["no_mesh", "mesh_4x2"])
def test_update_takes_state_as_it_returns_it(tmp_path, mesh_axes):
    """Params from models.load_hf without a mesh (committed to one device), the optimizer state from
    step.init_opt_state: 3 steps compile one update program (without a mesh the update used to compile again at
    step 2; on a 4x2 mesh it refused the one-device params), and every returned parameter carries the layout the
    update takes (the default device; on the mesh, the logical-axis rules' layout)."""
    config = tiny_config()
    models.save_hf(str(tmp_path), config, models.init_params(config, jax.random.key(0)))
    config, params = models.load_hf(str(tmp_path), logits_seq_chunk=16, logits_vocab_chunk=40)
    mesh = None if mesh_axes is None else sharding.make_mesh(mesh_axes)
    rl = RLConfig(alpha=0.0, num_microbatches=1)
    step = make_rl_step(config, optax.adamw(1e-3), mesh, rl)
    if mesh is None:
        target = [jax.sharding.SingleDeviceSharding(jax.devices()[0])] * len(jax.tree.leaves(params))
    else:
        target = jax.tree.leaves(models.param_shardings(config, mesh))
        assert any(not x.sharding.is_equivalent_to(s, x.ndim) for x, s in zip(jax.tree.leaves(params), target))
    opt_state = step.init_opt_state(params)
    for seed in range(3):
        trs = random_batch(seed, config.vocab_size, (2, 1, 2, 1), coach_prob=0.0)
        batch = step.place(prepare_batch(trs, rl, rows_multiple=step.rows_multiple(), row_len=64, num_rows=4,
                                         pad_multiple=16))
        params, opt_state, m = step(params, opt_state, batch)
    assert np.isfinite(float(m["loss"])) and step.num_compilations == 1
    for x, s in zip(jax.tree.leaves(params), target):
        assert x.sharding.is_equivalent_to(s, x.ndim)
