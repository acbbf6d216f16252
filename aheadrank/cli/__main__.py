"""``python -m aheadrank.cli ...``: the same as the ``aheadrank`` console script."""

from aheadrank.cli import main

main()
