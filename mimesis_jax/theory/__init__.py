"""The theory lab: docs/reference/paper.md §7 (Appendix E, Proposition E.1 and Theorem E.2) checked on small finite problems.

* mdp.py: random finite-horizon MDPs, exact evaluation (dynamic programming; enumeration for checks), exact
  tabular-softmax directions, sampled GRPO groups.
* updates.py: Proposition E.1's closed-form update and a numerical maximiser of its objective; AdamW.
* claims.py: one function per claim, each returning table rows (`ClaimResult`).
* the `python -m mimesis_jax theory` command (the table, theory.json and the plots) is commands/theory.py.
"""
