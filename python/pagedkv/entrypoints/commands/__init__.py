"""Subcommands of the ``pagedkv`` CLI, one module each.

A module here defines ``NAME`` (the subcommand), ``HELP`` (one line), ``add_arguments(parser)``
and ``run(args) -> int``. The CLI discovers them, so adding a command touches no other file.
"""
