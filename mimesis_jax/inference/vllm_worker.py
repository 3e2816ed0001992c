"""The child process of the vLLM generator (inference/vllm_generator.py): vLLM in its own Python environment
(scripts/vllm_env.sh), run by path, importing only vLLM, torch, safetensors and the standard library -- never this
project, whose pins (jax, transformers) differ from vLLM's.

    <vllm python> mimesis_jax/inference/vllm_worker.py '<json settings>' <reply fd>

The protocol: one JSON object per line. Commands come on stdin; replies go to the file descriptor given as the
second argument (the parent's pipe), so whatever vLLM prints on stdout/stderr never mixes with them. Every reply is
{"ok": true, ...} or {"ok": false, "error": "<one line>"}; the first, sent once the engine is up, is {"ok": true,
"ready": true}.

* {"op": "generate", "prompts": [[id, ...], ...], "sampling": [{max_tokens, temperature, top_p, top_k, seed}, ...]}
  -> {"ok": true, "samples": [{"tokens": [...], "logprobs": [...], "finish_reason": "stop" | "length"}, ...]}:
  one sampling per prompt, in order. A log-prob is log_softmax(logits / T)[token] at the request's temperature T
  (T = 1 for greedy; vLLM's "processed_logprobs" with top_p = 1 and top_k = 0, the RL setting).
* {"op": "load", "buckets": N} -> the weights are replaced in place by N buckets of HF-named tensors, streamed:
  the worker answers {"ok": true, "want": i} for bucket i, the parent then writes it as a safetensors file and sends
  {"path": "<file>"}; after the last one the prefix cache is reset and the answer is {"ok": true, "loaded": n,
  "seconds": s} (n tensors). One bucket is on the file system at a time (the parent removes each when the next is
  asked for), and all of them feed one in-place reload (vLLM's `reload_weights` over an iterator).
* {"op": "close"} -> {"ok": true}, then the process exits at once (os._exit: vLLM's own teardown at interpreter
  exit takes seconds and sometimes aborts, rc 134, after all its work is done).

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so that the reload's iterator reaches the model
runner directly.
"""

import json
import os
import sys
import time


def _reply(out, obj) -> None:
    out.write(json.dumps(obj) + "\n")
    out.flush()


def _cpu_args(model_dir: str, max_model_len: int) -> dict:
    """vLLM's CPU backend cannot rewind a seeded request's torch generator (`set_offset`: "CPU Generator does not
    use offset"), which vLLM does after every step that prefills only part of a prompt. So on a CPU no prompt is
    split: chunked prefill is off (a step holds whole prompts, at least one of max_model_len tokens), and for a
    hybrid model (linear-attention layers, e.g. Qwen3.5) prefix caching is off too, since its state cache's 'align'
    mode needs chunked prefill. On GPUs: vLLM's defaults."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return {"enable_prefix_caching": True}
    with open(os.path.join(model_dir, "config.json")) as f:
        hybrid = "linear_attention" in json.load(f).get("layer_types", ())
    return {"enable_prefix_caching": not hybrid, "enable_chunked_prefill": False,
            "max_num_batched_tokens": max(max_model_len, 4096)}


def _engine(settings: dict):
    import gc

    from vllm import LLM

    # vLLM's start calls gc.collect() several times (model load, memory accounting); the objects its imports made
    # live as long as the process, so they go to the collector's permanent generation and those passes skip them
    gc.freeze()
    args = dict(model=settings["model"], dtype=settings["dtype"], seed=int(settings.get("seed", 0)),
                skip_tokenizer_init=True, max_model_len=int(settings["max_model_len"]),
                logprobs_mode="processed_logprobs", max_num_seqs=int(settings.get("max_num_seqs", 16)),
                enforce_eager=True, kv_cache_memory_bytes=int(settings["kv_cache_bytes"]),
                **_cpu_args(settings["model"], int(settings["max_model_len"])))
    return LLM(**{**args, **settings.get("engine_args", {})})  # engine_args override these


def _generate(llm, msg: dict) -> dict:
    from vllm import SamplingParams, TokensPrompt

    stops = [int(t) for t in msg.get("stop_ids", [])]
    params = [SamplingParams(max_tokens=int(s["max_tokens"]), temperature=float(s["temperature"]),
                             top_p=float(s["top_p"]), top_k=int(s["top_k"]) or -1, seed=int(s["seed"]),
                             logprobs=0, stop_token_ids=stops, detokenize=False, ignore_eos=True)
              for s in msg["sampling"]]
    prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in msg["prompts"]]
    outs = llm.generate(prompts, params, use_tqdm=False)
    samples = []
    for o in outs:
        c = o.outputs[0]
        lps = [float(step[tok].logprob) for tok, step in zip(c.token_ids, c.logprobs or [])]
        samples.append({"tokens": [int(t) for t in c.token_ids], "logprobs": lps,
                        "finish_reason": "stop" if c.finish_reason == "stop" else "length"})
    return {"ok": True, "samples": samples}


def _refresh_head(worker) -> None:
    """Re-derives the LM head's kernel copy from its weight. With tied embeddings the checkpoint has no
    lm_head.weight, so the in-place reload loads the embedding alone and never re-processes the head; on a CPU the
    head keeps a packed GEMM copy made at load time (vLLM's UnquantizedEmbeddingMethod), which would otherwise
    stay at the old weights. Elsewhere the call changes nothing."""
    head = worker.model_runner.get_model().lm_head
    head.quant_method.process_weights_after_loading(head)


def _load(llm, msg: dict, commands, out) -> dict:
    from safetensors.torch import load_file

    n_buckets, count = int(msg["buckets"]), [0]
    t0 = time.perf_counter()

    def weights():
        for i in range(n_buckets):
            _reply(out, {"ok": True, "want": i})
            path = json.loads(commands.readline())["path"]
            tensors = load_file(path)
            for name, w in tensors.items():
                count[0] += 1
                yield name, w
            del tensors

    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights()})
    llm.collective_rpc(_refresh_head)
    llm.reset_prefix_cache()
    return {"ok": True, "loaded": count[0], "seconds": time.perf_counter() - t0}


def main() -> None:
    settings = json.loads(sys.argv[1])
    out = os.fdopen(int(sys.argv[2]), "w")
    commands = sys.stdin
    try:
        llm = _engine(settings)
    except Exception as e:  # the parent raises it with the message
        _reply(out, {"ok": False, "error": f"vLLM did not start: {type(e).__name__}: {e}".replace("\n", " ")})
        return
    _reply(out, {"ok": True, "ready": True})
    for line in commands:
        msg = json.loads(line)
        op = msg.get("op")
        if op == "close":
            _reply(out, {"ok": True})
            out.close()
            os._exit(0)
        try:
            if op == "generate":
                reply = _generate(llm, msg)
            elif op == "load":
                reply = _load(llm, msg, commands, out)
            else:
                reply = {"ok": False, "error": f"unknown op {op!r}"}
        except Exception as e:  # reported to the parent, which raises it
            reply = {"ok": False, "error": f"{op}: {type(e).__name__}: {e}".replace("\n", " ")}
        _reply(out, reply)
    out.close()


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    main()
