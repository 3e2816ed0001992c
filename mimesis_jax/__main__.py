"""`python -m mimesis_jax ...`: see mimesis_jax/cli.py."""

import sys

from mimesis_jax.cli import main

sys.exit(main())
