"""``python -m aaco.agent``: the ``aaco`` command line, for hosts where the console script is not installed."""

from aaco.agent.cli import main

main()
