"""`VLLMGenerator`: vLLM behind the generation protocol (inference/protocol.py), in a child process this generator
starts, talks to and stops (issue #45).

    gen = VLLMGenerator(config, params, stop_ids=(tok.im_end_id, tok.eos_id), python="~/.cache/mimesis_vllm/bin/python")
    out = gen.generate(prompts, Sampling(max_tokens=64, temperature=1.0, seed=7))   # token ids in and out
    gen.set_params(new_params, version=3)          # streamed into vLLM in place, prefix cache reset
    gen.last_sync                                  # {"seconds", "bytes", "buckets", "tensors", "version"}
    gen.close()

* **The child.** `python` (`rollout.vllm_python`; default `DEFAULT_PYTHON`, the environment scripts/vllm_env.sh
  builds) runs inference/vllm_worker.py by path: vLLM and the standard library only, no project import, so vLLM's
  pins (its torch, an older transformers) never meet the project's. The two talk in JSON lines: commands on the
  child's stdin, replies on a pipe of their own (the worker's docstring has the messages); the child's stdout and
  stderr go to `log_path` (vLLM's own logging). A child that dies makes the next call raise `VLLMError` with the
  tail of that log.
* **The model.** vLLM starts from a HF directory: config.json and the weights of `params`, written by
  models.save_hf in the rollout dtype (`config.dtype`, the compute dtype) into a private directory (on /dev/shm
  where there is one); once vLLM has loaded them the safetensors file is removed. vLLM's CPU attention needs
  head_dim >= 32.
* **Weight sync** (`set_params`). The weights go over as HF names them (models/hf.py's tensor table of the family,
  the same names save_hf writes), in the rollout dtype, in buckets of at most `bucket_bytes`: each bucket is one
  safetensors file on tmpfs that the child reads and hands to vLLM's in-place reload (all buckets feed one
  `reload_weights` over an iterator) before the next is written, so the file system holds one bucket at a time. The
  prefix cache is reset after every sync; `last_sync` keeps its seconds and bytes. On GPUs the same call would
  pass CUDA IPC handles instead of files (not built here).
* **Samples.** Token ids in, token ids out: nothing is decoded or tokenised. Each request carries its seed
  (`protocol.request_seeds`: its own, else derived from the generator's seed and call count), so a seed gives the
  same sample. The log-prob of a token is log_softmax(logits / T)[token] at the request's temperature (T = 1 when
  greedy), unfiltered when top_p = 1 and top_k = 0 -- what the project's sampler returns and the RL update scores.
  With top-p / top-k on, vLLM's log-probs are of the filtered distribution. `keys` and `cancel` are ignored (vLLM's
  prefix cache reuses a dialogue's earlier turns by itself).
* **Threads.** One exchange with the child at a time: `generate`, `set_params` and `close` each hold the
  generator's lock for their whole exchange, so the asynchronous RL loop's producer thread (sampling) and its
  trainer thread (syncing each new version) never interleave their lines on the pipe; a sync waits for the call in
  flight and the next call samples with the new version. The weights live in the child: `params` is None, and
  `set_params` has read every tensor it was given by the time it returns, so its caller may then donate or drop
  them (the learner hands over the training arrays themselves, no copy).
* **Exit.** `close()` asks the child to stop and waits; vLLM may abort at interpreter exit after its work is done
  (rc 134, SIGABRT): that is known and not an error. A child that does not stop in `close_timeout_s` is killed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Sequence

import jax
import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from mimesis_jax.errors import ConfigError
from mimesis_jax.inference.protocol import Generator, Sample, per_request, request_seeds
from mimesis_jax.models import family, save_hf
from mimesis_jax.models.config import ModelConfig

DEFAULT_PYTHON = os.path.join("~", ".cache", "mimesis_vllm", "bin", "python")
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_worker.py")
_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
KNOWN_EXIT_ABORT = 134  # vLLM's occasional abort at interpreter exit, after its work is done


class VLLMError(RuntimeError):
    """The vLLM child failed: its message, or that it died (with the tail of its log)."""


def resolve_python(python: str | None) -> str:
    """The child's interpreter: `python` (~ expanded), else DEFAULT_PYTHON. A missing one is a ConfigError naming
    rollout.vllm_python and the command that builds the default environment."""
    path = os.path.expanduser(python or DEFAULT_PYTHON)
    if not os.access(path, os.X_OK):
        raise ConfigError(f"config key 'rollout.vllm_python': no Python at {path!r} (build the vLLM environment with "
                          "scripts/vllm_env.sh, or point the key at one that imports vllm)")
    return path


def _scratch_dir() -> str:
    return tempfile.mkdtemp(prefix="mimesis_vllm_", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)


def hf_buckets(config: ModelConfig, max_bytes: int) -> list[list]:
    """The family's HF tensors (models/hf.py's table) in order, grouped into buckets of at most `max_bytes` in the
    rollout dtype (`config.dtype`; a larger tensor is a bucket of its own)."""
    itemsize = np.dtype(_NP_DTYPES[config.dtype]).itemsize
    buckets, size = [[]], 0
    for e in family(config, "hf").hf_tensors(config):
        nbytes = math.prod(e.hf_shape) * itemsize
        if buckets[-1] and size + nbytes > max_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(e)
        size += nbytes
    return buckets


def bucket_tensors(config: ModelConfig, params, bucket) -> dict[str, np.ndarray]:
    """{HF name: array in the rollout dtype} of one bucket, fetched from `params` one tensor at a time."""
    dtype = np.dtype(_NP_DTYPES[config.dtype])
    out = {}
    for e in bucket:
        leaf = params
        for p in e.path:
            leaf = leaf[p]
        w = np.asarray(jax.device_get(leaf if e.index is None else leaf[e.index]), np.float32)
        out[e.name] = np.ascontiguousarray(e.to_hf(w).astype(dtype, copy=False))
    return out


class VLLMGenerator(Generator):
    """vLLM in a child process behind the protocol (the module docstring). config: the model's ModelConfig (its
    `dtype` is the rollout dtype); params: the weights it starts with; stop_ids: the ids a turn ends with;
    max_model_len: the longest prompt + continuation (default: config.max_position_embeddings); kv_cache_bytes: the
    KV cache vLLM reserves; max_num_seqs: requests decoded together; bucket_bytes: the most bytes one sync bucket
    holds; engine_args: more keyword arguments for vLLM's `LLM(...)`; start_timeout_s: how long vLLM may take to
    start."""

    params = None  # the weights live in the child (the module docstring, "Threads")

    def __init__(self, config: ModelConfig, params, *, stop_ids: Sequence[int], seed: int = 0,
                 python: str | None = None, max_model_len: int = 0, kv_cache_bytes: int = 1 << 30,
                 max_num_seqs: int = 16, bucket_bytes: int = 256 << 20, engine_args: dict | None = None,
                 version: int = 0, log_path: str | None = None, start_timeout_s: float = 600.0,
                 close_timeout_s: float = 60.0):
        if config.dtype not in _NP_DTYPES:
            raise ConfigError(f"config key 'model.dtype': the vLLM generator takes {list(_NP_DTYPES)}, got "
                              f"{config.dtype!r}")
        python = resolve_python(python)
        self.config, self.seed, self.version, self._calls = config, seed, version, 0
        self.stop_ids = [int(t) for t in stop_ids]
        self.bucket_bytes, self.close_timeout_s = int(bucket_bytes), close_timeout_s
        self.last_sync: dict | None = None
        self.exit_code: int | None = None
        self._proc = None
        self._lock = threading.Lock()
        self._dir = _scratch_dir()
        self.log_path = log_path or os.path.join(self._dir, "vllm.log")
        model_dir = os.path.join(self._dir, "model")
        save_hf(model_dir, dataclasses.replace(config, param_dtype=config.dtype), params)
        settings = dict(model=model_dir, dtype=config.dtype, seed=seed, max_num_seqs=max_num_seqs,
                        max_model_len=max_model_len or config.max_position_embeddings,
                        kv_cache_bytes=int(kv_cache_bytes), engine_args=engine_args or {})
        self._start(python, settings, start_timeout_s)
        os.remove(os.path.join(model_dir, "model.safetensors"))  # vLLM holds them now

    # ------------------------------------------------------------------ the child
    def _start(self, python: str, settings: dict, timeout_s: float) -> None:
        read_fd, write_fd = os.pipe()
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
        self._log = open(self.log_path, "w")
        try:
            self._proc = subprocess.Popen([python, WORKER, json.dumps(settings), str(write_fd)],
                                          stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT,
                                          pass_fds=(write_fd,), text=True, env=env)
        finally:
            os.close(write_fd)  # the child holds the only writer: its death ends our reads
        self._replies = os.fdopen(read_fd, "r")
        timer = threading.Timer(timeout_s, self._proc.kill)
        timer.start()
        try:
            self._read()
        except VLLMError:
            self._stop_child()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        finally:
            timer.cancel()

    def _send(self, msg: dict) -> None:
        try:
            self._proc.stdin.write(json.dumps(msg) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise VLLMError(self._died()) from None

    def _read(self) -> dict:
        line = self._replies.readline()
        if not line:
            raise VLLMError(self._died())
        reply = json.loads(line)
        if not reply.get("ok"):
            raise VLLMError(f"vLLM child: {reply.get('error')}")
        return reply

    def _died(self) -> str:
        rc = self._proc.poll()
        tail = ""
        if os.path.exists(self.log_path):
            with open(self.log_path, errors="replace") as f:
                tail = " | ".join(f.read().strip().splitlines()[-5:])
        return f"vLLM child exited (rc {rc}); its log {self.log_path} ends: {tail}"

    # ------------------------------------------------------------------ the protocol
    def generate(self, prompts, sampling, *, keys=None, cancel=None) -> list[Sample]:
        reqs = per_request(sampling, len(prompts))
        with self._lock:
            seeds = request_seeds(reqs, self.seed, self._calls)
            self._calls += 1
            cols = [dict(max_tokens=r.max_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, seed=s)
                    for r, s in zip(reqs, seeds)]
            self._send({"op": "generate", "prompts": [[int(t) for t in p] for p in prompts], "sampling": cols,
                        "stop_ids": self.stop_ids})
            got = self._read()["samples"]
            version = self.version
        return [Sample(tokens=s["tokens"], logprobs=s["logprobs"], finish_reason=s["finish_reason"],
                       prompt_len=len(p), version=version) for s, p in zip(got, prompts)]

    def set_params(self, params, version: int) -> None:
        buckets = hf_buckets(self.config, self.bucket_bytes)
        nbytes, path = 0, None
        with self._lock:  # the sync's seconds start once the call in flight (another thread's) has ended
            t0 = time.perf_counter()
            self._send({"op": "load", "buckets": len(buckets)})
            for i, bucket in enumerate(buckets):
                want = self._read().get("want")
                if want != i:
                    raise VLLMError(f"weight sync: the child asked for bucket {want}, expected {i}")
                if path is not None:
                    os.remove(path)
                tensors = bucket_tensors(self.config, params, bucket)
                nbytes += sum(w.nbytes for w in tensors.values())
                path = os.path.join(self._dir, f"bucket-{i}.safetensors")
                save_file(tensors, path, metadata={"format": "pt"})
                del tensors
                self._send({"path": path})
            done = self._read()
            if path is not None:
                os.remove(path)
            self.version = version
            self.last_sync = dict(seconds=time.perf_counter() - t0, bytes=nbytes, buckets=len(buckets),
                                  tensors=done["loaded"], reload_seconds=done["seconds"], version=version)

    def close(self) -> None:
        """Stops the child (rc 134 at its exit is vLLM's known abort, not an error) and removes the scratch
        directory. Calling it again does nothing."""
        if self.exit_code is None and self._proc is not None:
            with self._lock:
                try:
                    self._send({"op": "close"})
                    self._read()
                except VLLMError:
                    pass  # already gone: its exit code says how
                self._stop_child()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _stop_child(self) -> None:
        try:
            self.exit_code = self._proc.wait(timeout=self.close_timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self.exit_code = self._proc.wait()
        for f in (self._proc.stdin, self._replies, self._log):
            try:
                f.close()
            except (BrokenPipeError, OSError):
                pass
