"""Placements from the scheduler: which job runs where, and who owns it.

The engine can only explain a wait once it knows the job's ranks, nodes and owner.
This package turns what a scheduler already knows into ``placement`` messages (the
contract in :mod:`whywait.agents.events`):

* :mod:`whywait.engine.placement.model`: :class:`JobFacts` (what a scheduler says about a job)
  and :func:`placement_message` (facts + owner → a valid message);
* :mod:`whywait.engine.placement.ownership`: the ownership YAML (Slurm account, Kubernetes
  namespace or labels → project, team, Slack channel), hot-reloaded;
* :mod:`whywait.engine.placement.slurm`: a job's facts from ``scontrol show job -d --json`` or
  its prolog environment;
* :mod:`whywait.engine.placement.k8s`: GPU pods from the Kubernetes watch API, grouped into jobs;
* :mod:`whywait.engine.placement.filesource`: JSON/YAML placements for everything else.

``whywait placement`` (``engine/commands/placement_cmd.py``) is the thin edge that
reads, publishes to Kafka and handles signals.  Nothing here imports aiokafka.
"""
