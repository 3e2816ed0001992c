"""Stage I ablation on a CPU (docs/reference/paper.md §6, Appendix C): user-side mid-training on/off x the ABCD behaviour task in
joint RL on/off, through tiny mid-training -> ThoughtTrace SFT -> joint multi-domain RL (configs/tiny_*.py) with few
steps. 4 cells; mid-training runs once and the SFT run from it is shared by the two mid-training=on cells.

midtrain=off removes the stage: SFT then starts from the tiny config's random initialisation (the tiny stand-in for
"pretrained"). behaviour=off sets simrl domains.behaviour=false: joint RL on hitom alone.

    python -m mimesis_jax ablate --matrix configs/ablations/tiny_stage1.py --out runs/abl_stage1
"""


def get_matrix():
    return {
        "name": "tiny_stage1",
        "stages": [("midtrain", "configs/tiny_midtrain.py"), ("sft", "configs/tiny_sft.py"),
                   ("simrl", "configs/tiny_simrl.py")],
        "overrides": [("midtrain", "train.steps=20"), ("midtrain", "optimizer.warmup_steps=2"),
                      ("midtrain", "checkpoint.every=20"),
                      ("sft", "train.steps=6"), ("sft", "optimizer.warmup_steps=1"), ("sft", "checkpoint.every=6"),
                      ("simrl", "train.steps=3"), ("simrl", "checkpoint.every=3")],
        "switches": {
            "midtrain": {"on": [], "off": [("midtrain", "off")]},
            "behaviour": {"on": [("simrl", "domains.behaviour=true")],
                          "off": [("simrl", "domains.behaviour=false")]},
        },
    }
