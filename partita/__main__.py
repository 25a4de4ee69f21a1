"""`python -m partita` is the `partita` command."""
import sys

from partita.cli import main

sys.exit(main())
