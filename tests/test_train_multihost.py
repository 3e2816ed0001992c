"""The CLI trainer as two jax.distributed processes (4 CPU devices each, one fsdp 4 x tensor 2 mesh): the losses
equal a single-process run on the same global batches, and the checkpoint holds both hosts' data positions."""

import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import orbax.checkpoint as ocp
import pytest

from helpers import subprocess_env

from mimesis_jax.config import load_config
from mimesis_jax.checkpoints import Checkpointer
from mimesis_jax.train.loop import train
from mimesis_jax.train.metrics import read_metrics
from mimesis_jax.train.synthetic import SyntheticIterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = textwrap.dedent("""
    from mimesis_jax.config import CheckpointConfig, MeshConfig, OptimizerConfig, RunConfig, TrainConfig
    from mimesis_jax.models import ModelConfig
    from mimesis_jax.train.synthetic import SyntheticData

    def get_config():
        model = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, logits_vocab_chunk=32,
                            logits_seq_chunk=16)
        return RunConfig(stage="midtrain", model=model, data=SyntheticData(vocab_size=64, seq_len=32),
                         optimizer=OptimizerConfig(lr=3e-3, warmup_steps=1),
                         train=TrainConfig(steps=3, global_batch=8, grad_accum=2, dtype="float32",
                                           progress_bar=False, tensorboard=False, prefetch=0),
                         mesh=MeshConfig(data=1, fsdp=4, tensor=2),
                         checkpoint=CheckpointConfig(every=2, keep=3, async_save=True))
""")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _BothHosts:
    """The global batch the two processes assemble: host 0's 4 rows, then host 1's."""

    def __init__(self, data, seed):
        self.parts = [SyntheticIterator(data, 4, seed, p) for p in (0, 1)]

    def __iter__(self):
        return self

    def __next__(self):
        a, b = (next(p) for p in self.parts)
        return {k: np.concatenate([a[k], b[k]]) for k in a}

    def get_state(self):
        return self.parts[0].get_state()

    def set_state(self, s):
        for p in self.parts:
            p.set_state(s)


@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path):
    cfg_file = tmp_path / "cfg.py"
    cfg_file.write_text(CONFIG)
    wd = tmp_path / "multi"
    port = str(_free_port())
    env = subprocess_env(devices=4, PYTHONUNBUFFERED="1")
    procs = [subprocess.Popen([sys.executable, "-m", "mimesis_jax", "midtrain", "--config", str(cfg_file),
                               "--workdir", str(wd), "--distributed", "--coordinator", f"127.0.0.1:{port}",
                               "--num-processes", "2", "--process-id", str(i)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=400)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("multi-process training timed out")
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    multi = {r["step"]: r["loss"] for r in read_metrics(str(wd))}
    assert sorted(multi) == [1, 2, 3]

    cfg = load_config(str(cfg_file))
    ref = train(cfg, str(tmp_path / "single"), data=lambda tok, b, seed, pi, pc: _BothHosts(cfg.data, seed),
                handle_signals=False)
    for s in (1, 2, 3):
        assert abs(multi[s] - ref.losses[s]) <= 1e-5 * abs(ref.losses[s]), (s, multi[s], ref.losses[s])

    ck = Checkpointer(str(wd), read_only=True)
    assert ck.all_steps() == [2, 3]
    data = ck.manager.restore(3, args=ocp.args.Composite(data_iter=ocp.args.JsonRestore())).data_iter
    ck.close()
    assert data == {"process_count": 2, "states": [{"index": 3}, {"index": 3}]}
