"""Two local processes joined by jax.distributed (CPU, gloo collectives), 4 devices each, one global 8-device
mesh: the sharded loss and a gradient checksum equal the single-process values."""

import socket
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from helpers import subprocess_env

from mimesis_jax import models
from mimesis_jax.models import ModelConfig
from mimesis_jax.train.step import make_grad_step

CFG = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, head_dim=8, initializer_range=0.2)

WORKER = textwrap.dedent('''
    import os, sys
    pid, port = int(sys.argv[1]), sys.argv[2]
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    from mimesis_jax import sharding
    sharding.initialize_distributed(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    import numpy as np
    from mimesis_jax import models
    from mimesis_jax.models import ModelConfig
    from mimesis_jax.train.step import make_grad_step
    cfg = ModelConfig(**%(cfg)r)
    assert jax.process_count() == 2 and jax.device_count() == 8 and jax.local_device_count() == 4
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    params = models.init_params(cfg, jax.random.key(0), mesh=mesh)
    tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (8, 16)).astype(np.int32)
    local = {"tokens": tokens[pid * 4:(pid + 1) * 4], "loss_mask": np.ones((4, 16), np.float32)}
    batch = sharding.global_batch(local, mesh)
    loss, grads = make_grad_step(cfg, mesh)(params, batch)
    gsum = float(jax.jit(lambda g: sum(jax.numpy.abs(x).sum() for x in jax.tree.leaves(g)))(grads))
    print("RESULT", pid, repr(float(loss)), repr(gsum), flush=True)
''')


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_process_mesh_equals_single_process(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER % {"cfg": CFG})
    port = str(_free_port())
    env = subprocess_env()
    procs = [subprocess.Popen([sys.executable, str(script), str(i), port], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env) for i in range(2)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("multi-process run timed out")
    results = {}
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
        line = [ln for ln in out.splitlines() if ln.startswith("RESULT")][-1].split()
        results[int(line[1])] = (float(line[2]), float(line[3]))
    cfg = ModelConfig(**CFG)
    params = models.init_params(cfg, jax.random.key(0))
    tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (8, 16)).astype(np.int32)
    loss, grads = make_grad_step(cfg)(params, {"tokens": tokens, "loss_mask": np.ones((8, 16), np.float32)})
    gsum = float(sum(np.abs(np.asarray(g)).sum() for g in jax.tree.leaves(grads)))
    for pid in (0, 1):
        assert abs(results[pid][0] - float(loss)) <= 1e-5 * abs(float(loss))
        assert abs(results[pid][1] - gsum) <= 1e-5 * gsum
