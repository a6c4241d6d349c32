"""CLI subcommands, one module each.

Each module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``. ``COMMANDS`` is the registry ``cli.py`` builds its parser from;
a new subcommand is one new module plus one line here.

``cli.py`` imports every command module to build its parser, so a command imports
what it runs (the engine, pandas, plots) inside ``run``: ``--help`` and a mistyped
argument answer without loading any of it.
"""

COMMANDS = (
    "replay_ops",
    "validate",
    "run",
    "plot",
    "report",
    "sweep",
    "census",
    "calibrate",
    "repro",
    "verify_bundle",  # the `replay BUNDLE` command
    "bound",
    "plan",
    "schema",
    "traces",
    "import_dump",  # the `import DUMP` command
)
