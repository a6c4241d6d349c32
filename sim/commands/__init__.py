"""CLI subcommands, one module each.

Each module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``. ``COMMANDS`` is the registry ``cli.py`` builds its parser from;
a new subcommand is one new module plus one line here.
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
