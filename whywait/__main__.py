"""``python -m whywait``: the same CLI as the ``whywait`` command."""

from whywait.engine.cli import main

raise SystemExit(main())
