"""whywait watching itself: the engine's metrics (:mod:`.metrics`), served with the health checks by
:class:`whywait.agents.observe.ObserveServer`."""
