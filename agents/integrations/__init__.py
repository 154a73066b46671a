"""Thin adapters from training frameworks to :class:`whywait.agents.training.Reporter`.

Each adapter imports its framework only when called, so importing this package
costs nothing on a node without PyTorch Lightning or ``transformers``::

    from whywait.agents.integrations import lightning_callback, hf_callback
    trainer = lightning.Trainer(callbacks=[lightning_callback(reporter)])
    trainer = transformers.Trainer(..., callbacks=[hf_callback(reporter)])

Both time a step from the framework's batch/step hooks: the gap between the end
of one step and the start of the next is the data wait (the loader's
``next()``), the rest is compute.  Communication that the framework overlaps
with backward cannot be told apart from compute at this level; wrap the
collective in ``reporter.comm()`` for that.
"""

from __future__ import annotations

import time
from typing import Any

from whywait.agents.training import PHASES, Reporter


class StepClock:
    """Framework-neutral step timing driven by ``begin(n)`` / ``end()`` hooks."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter
        self._last_end: float | None = None
        self._begin: float | None = None
        self._n = 0

    def begin(self, n: int) -> None:
        """Called at the start of step ``n`` (after its batch was fetched)."""
        self._begin = time.perf_counter()
        self._n = int(n)

    def end(self) -> None:
        """Called when the step's optimizer step is done; sends the step."""
        if self._begin is None:
            return
        now = time.perf_counter()
        wait = (self._begin - self._last_end) if self._last_end is not None else 0.0
        compute = now - self._begin
        phases = dict.fromkeys(PHASES, 0.0)
        phases["data_wait"] = max(wait, 0.0)
        phases["compute"] = compute
        self.reporter._send_step(self._n, phases["data_wait"] + compute, phases)
        self._last_end = now
        self._begin = None

    def checkpoint_saved(self, path: str | None = None) -> None:
        """A framework saved a checkpoint (its hooks fire after the save: the end only)."""
        cid = self.reporter.checkpoint_start(path)
        self.reporter.checkpoint_end(None, path, checkpoint_id=cid)


def lightning_callback(reporter: Reporter) -> Any:
    """A PyTorch Lightning ``Callback`` reporting each training batch as a step."""
    try:
        from lightning.pytorch import Callback  # noqa: PLC0415
    except ImportError:
        try:
            from pytorch_lightning import Callback  # type: ignore[no-redef]  # noqa: PLC0415
        except ImportError:
            raise ImportError("lightning_callback needs PyTorch Lightning (pip install lightning)") from None

    class WhywaitLightningCallback(Callback):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.clock = StepClock(reporter)

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            self.clock.begin(trainer.global_step)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            self.clock.end()

        def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any) -> None:
            self.clock.checkpoint_saved()

    return WhywaitLightningCallback()


def hf_callback(reporter: Reporter) -> Any:
    """A Hugging Face ``transformers.TrainerCallback`` reporting each optimizer step."""
    try:
        from transformers import TrainerCallback  # noqa: PLC0415
    except ImportError:
        raise ImportError("hf_callback needs transformers (pip install transformers)") from None

    class WhywaitHFCallback(TrainerCallback):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.clock = StepClock(reporter)

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.clock.begin(state.global_step)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.clock.end()

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.clock.checkpoint_saved(getattr(args, "output_dir", None))

    return WhywaitHFCallback()


__all__ = ["StepClock", "hf_callback", "lightning_callback"]
