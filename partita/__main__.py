"""`python -m partita` is the `partita` command.

`python -m` puts the current directory first on sys.path; it is taken off before anything else
is imported, so a file there (yaml.py, a scenario's module) is never imported by accident.
"""
import os
import sys

if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from partita.cli import main  # noqa: E402

sys.exit(main())
