"""One rank of a WebDataset reading job for tests/e2e/test_webdataset_ranks.py, started by torchrun.

``python wds_job.py OUT DATATAG STOP TOTAL``: read ``TOTAL`` batches with 2 DataLoader workers, writing this
rank's loader state to ``OUT/state{rank}.json`` after ``STOP`` batches; then write ``OUT/batches{rank}.json`` and
``OUT/ready{rank}`` and wait to be killed. With a state file already there it resumes from it, reads ``TOTAL -
STOP`` batches into ``OUT/resumed{rank}.json`` and exits."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist

from fastgen.datasets.webdataset import WebDatasetLoader


def write(path: Path, data: object) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data))
    os.replace(partial, path)


def main() -> None:
    out, tag, stop, total = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = WebDatasetLoader([tag], batch_size=4, fields={"key": "__key__"}, shuffle_buffer=10, num_workers=2,
                              prefetch_factor=3)
    state = out / f"state{rank}.json"
    if state.exists():
        loader.load_state_dict(json.loads(state.read_text()))
        write(out / f"resumed{rank}.json", [next(loader)["key"] for _ in range(total - stop)])
        dist.barrier()
        dist.destroy_process_group()
        return
    batches = []
    for i in range(total):
        if i == stop:
            write(state, loader.state_dict())
        batches.append(next(loader)["key"])
    write(out / f"batches{rank}.json", batches)
    (out / f"ready{rank}").touch()
    time.sleep(600)  # the test SIGKILLs the job, workers and all


if __name__ == "__main__":
    main()
