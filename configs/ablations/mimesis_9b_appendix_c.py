"""The paper's Stage I ablations (docs/reference/paper.md §6, Appendix C) at MIMESIS-9B scale: the full pipeline (user-side
mid-training -> ThoughtTrace SFT -> joint multi-domain RL with the behaviour task) and three one-switch-off variants:

* midtrain=off: no mid-training; SFT (and RL, if SFT is also off) start from the pretrained Qwen3.5-9B;
* thoughttrace=off: no ThoughtTrace SFT; RL starts from the mid-trained simulator (explicit reasoning collapses);
* behaviour=off: joint RL without the ABCD behaviour task (domains.behaviour=false).

4 explicit cells (not the 8 of the product); the full cell's mid-training and SFT runs are shared with the
behaviour=off cell. The stage configs are configs/mimesis_{midtrain,sft,simrl}.py:9b: point their data, the
pretrained checkpoint and the judge endpoint at your copies with --set (e.g. --set midtrain:data.sources.0.path=...
simrl:sides.judge=https://judge.example/v1), or edit PRETRAINED. Each cell's simulator is then evaluated with
`python -m mimesis_jax evalsim` (RealUserSim FI, USI, Turing distance: the numbers Appendix C compares).

    python -m mimesis_jax ablate --matrix configs/ablations/mimesis_9b_appendix_c.py --out runs/appendix_c --dry-run
"""

PRETRAINED = "checkpoints/Qwen3.5-9B"  # the HF directory configs/mimesis_midtrain.py:9b starts from


def get_matrix():
    from_pretrained = [("sft", "init.from_workdir="), ("sft", f"init.from_hf={PRETRAINED}"),
                       ("simrl", "init.from_workdir="), ("simrl", f"init.from_hf={PRETRAINED}")]
    return {
        "name": "mimesis_9b_appendix_c",
        "stages": [("midtrain", "configs/mimesis_midtrain.py:9b"), ("sft", "configs/mimesis_sft.py:9b"),
                   ("simrl", "configs/mimesis_simrl.py:9b")],
        "switches": {
            "midtrain": {"on": [], "off": [("midtrain", "off")] + from_pretrained},
            "thoughttrace": {"on": [], "off": [("sft", "off")]},
            "behaviour": {"on": [("simrl", "domains.behaviour=true")],
                          "off": [("simrl", "domains.behaviour=false")]},
        },
        "cells": [
            {"midtrain": "on", "thoughttrace": "on", "behaviour": "on"},
            {"midtrain": "off", "thoughttrace": "on", "behaviour": "on"},
            {"midtrain": "on", "thoughttrace": "off", "behaviour": "on"},
            {"midtrain": "on", "thoughttrace": "on", "behaviour": "off"},
        ],
    }
