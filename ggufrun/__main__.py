"""`python -m ggufrun ...`: the same as the `ggufrun` command (ggufrun.cli.main)."""

from .cli import main

raise SystemExit(main())
