"""The toy coach: the informative one names the user's letter; the control's notes never depend on it."""

import re

from mimesis_jax.envs.toy import ToyCoach


def _prompt(letter):
    return [{"role": "user", "content": f"Only 1 of 6 words in that reply started with '{letter}'. I wanted far more "
                                        f"words starting with '{letter}'."}]


def test_control_notes_name_only_untaught_letters_whatever_the_target():
    assert not set(ToyCoach.NULL_LETTERS) & set(ToyCoach.NOTE_LETTERS)
    assert re.search(r"'(\w)'", ToyCoach().chat(_prompt("s")).text).group(1) == "s"
    named = {}
    for target in ToyCoach.NOTE_LETTERS:
        coach = ToyCoach(shuffle_seed=3)  # same seed: the same notes whatever the target
        named[target] = [re.search(r"'(\w)'", coach.chat(_prompt(target)).text).group(1) for _ in range(200)]
    first = named["s"]
    assert set(first) == set(ToyCoach.NULL_LETTERS)
    assert all(v == first for v in named.values())
    assert ToyCoach(shuffle_seed=3).chat([{"role": "user", "content": "no thought"}]).text == "NONE"
