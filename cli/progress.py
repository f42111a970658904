"""A live progress bar (loss, it/s, global samples/s, ETA) for interactive terminals, as a trainer callback.

Only rank 0 shows it. Throughput is global: optimizer steps per second times the global batch (every rank's
samples, every accumulation round). The loss is rank 0's, read at most five times a second, so the bar adds no
device sync and no collective to most steps.
"""

from __future__ import annotations

import time
from typing import Any

from fastgen.callbacks.callback import Callback


class ProgressBarCallback(Callback):
    def __init__(self, console: Any) -> None:
        self.console = console
        self.progress: Any = None
        self.task: Any = None
        self._last = 0.0

    def on_train_begin(self, model: Any, iteration: int = 0) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[rate]} it/s"),
            TextColumn("{task.fields[samples]} samples/s"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self.progress.start()
        self.task = self.progress.add_task("train", total=self.config.trainer.max_iter, completed=iteration,
                                           loss="-", rate="-", samples="-")
        self._start_iter, self._start_time = iteration, time.perf_counter()

    def on_training_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict, iteration: int = 0) -> None:
        now = time.perf_counter()
        if now - self._last < 0.2 and iteration != self.config.trainer.max_iter:
            return
        self._last = now
        rate = (iteration - self._start_iter) / max(now - self._start_time, 1e-9)
        loss = float(loss_dict["total_loss"].detach())
        samples = rate * self.trainer.global_batch_size
        self.progress.update(self.task, completed=iteration, loss=f"{loss:.4f}", rate=f"{rate:.1f}",
                             samples=f"{samples:,.0f}")

    def on_app_end(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
