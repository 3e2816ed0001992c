"""Checkpoints fail soft: a damaged step is named (item and file) and resuming falls back to the newest intact one."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mimesis_jax.checkpoints import CheckpointError, Checkpointer


def _state(v):
    return {"params": {"w": jnp.full((64, 32), v, jnp.float32)}, "opt_state": {"m": jnp.full((64, 32), -v)},
            "step": jnp.asarray(int(v), jnp.int32), "rng": jax.random.key_data(jax.random.key(0)),
            "nonfinite": jnp.asarray(0, jnp.int32)}


def _abstract():
    dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=dev), _state(0.0))


def _saved(tmp_path, async_save):
    ck = Checkpointer(str(tmp_path), keep=3, async_save=async_save)
    for step in (1, 2):
        ck.save(step, _state(float(step)), {"pos": step}, {"run": step})
    ck.close()
    return str(tmp_path)


def _largest_file(step_dir, item):
    files = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(step_dir, item)) for f in fs]
    return max(files, key=os.path.getsize)


@pytest.mark.parametrize("async_save", [False, True])
def test_checksums_recorded_and_intact_steps_restore(tmp_path, async_save):
    wd = _saved(tmp_path, async_save)
    assert sorted(os.listdir(os.path.join(wd, "checkpoint_checksums"))) == ["1.json", "2.json"]
    ck = Checkpointer(wd, read_only=True)
    logs = []
    step, state, data, run = ck.restore_newest_intact(_abstract(), log=logs.append)
    assert (step, data, run, logs) == (2, {"pos": 2}, {"run": 2}, [])
    np.testing.assert_array_equal(np.asarray(state["params"]["w"]), np.full((64, 32), 2.0, np.float32))


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_corrupt_latest_step_is_named_and_resume_falls_back(tmp_path, damage):
    wd = _saved(tmp_path, async_save=False)
    victim = _largest_file(os.path.join(wd, "checkpoints", "2"), "opt_state")
    with open(victim, "r+b") as f:
        if damage == "truncate":
            f.truncate(os.path.getsize(victim) // 2)
        else:
            f.seek(os.path.getsize(victim) // 2)
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ 0xFF]))
    rel = os.path.relpath(victim, os.path.join(wd, "checkpoints", "2"))

    ck = Checkpointer(wd, keep=3, async_save=False)
    with pytest.raises(CheckpointError) as e:
        ck.restore_newest_intact(_abstract(), fallback=False)
    msg = str(e.value)
    assert "\n" not in msg and "checkpoint step 2 is corrupt" in msg and rel in msg and "item 'opt_state'" in msg

    logs = []
    step, state, data, _ = ck.restore_newest_intact(_abstract(), log=logs.append)
    assert step == 1 and data == {"pos": 1}
    np.testing.assert_array_equal(np.asarray(state["opt_state"]["m"]), np.full((64, 32), -1.0, np.float32))
    assert len(logs) == 1 and "falling back to step 1" in logs[0] and rel in logs[0]
    assert os.path.isdir(os.path.join(wd, "checkpoints_corrupt", "2")) and ck.all_steps() == [1]
    ck.save(2, _state(5.0), {"pos": 2}, {"run": 2})  # the run can write the step again
    ck.close()
    assert Checkpointer(wd, read_only=True).restore_newest_intact(_abstract())[0] == 2


def test_corrupt_metadata_names_the_step(tmp_path):
    wd = _saved(tmp_path, async_save=False)
    ck = Checkpointer(wd, read_only=True)
    meta = _largest_file(os.path.join(wd, "checkpoints", "2"), "run_config")
    with open(meta, "w") as f:
        f.write("{not json")
    with pytest.raises(CheckpointError, match=r"checkpoint step 2 is corrupt: .*run_config") as e:
        ck.verify(2)
    assert "\n" not in str(e.value)


def test_without_an_older_step_the_error_says_so(tmp_path):
    ck = Checkpointer(str(tmp_path), keep=3, async_save=False)
    ck.save(1, _state(1.0), {"pos": 1}, {"run": 1})
    ck.close()
    victim = _largest_file(os.path.join(str(tmp_path), "checkpoints", "1"), "params")
    with open(victim, "r+b") as f:
        f.truncate(1)
    with pytest.raises(CheckpointError, match="no older step to fall back to"):
        Checkpointer(str(tmp_path), read_only=True).restore_newest_intact(_abstract())
