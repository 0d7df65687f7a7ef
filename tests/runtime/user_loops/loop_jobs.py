"""Users' training loops for the tests of pollux_opt.elastic.

The tests name them by entry (``"loop_jobs.py:main"`` from this directory), so
worker processes import this file by its path.  The job's ``config``
(``pollux_opt.elastic.job_config()``) selects what a run does:

* ``samples``: dataset size (default 512); ``epochs``: the loop's epochs;
* ``trace_dir``: append ``epoch idx idx ...`` per micro-batch to a file there;
* ``schedule``: ``"batch"`` (a LambdaLR stepped per batch) or ``"epoch"``;
* ``raise_at_batch``: print a line, then raise ValueError at that batch; ``diverge_at_batch``:
  from that batch on report a loss 1e9 higher (the gradient is unchanged);
* ``num_workers``: DataLoader worker processes; ``delay_s``: sleep per batch;
* ``amp``: mixed precision (bfloat16 autocast on the CPU, float16 on a GPU) with a GradScaler of
  ``init_scale`` and ``growth_interval``; ``usual``: the script calls
  ``scaler.scale(loss).backward()``, ``scaler.step`` and ``scaler.update``
  itself, else ``model.backward(loss)`` and ``optimizer.step()``.
"""

import os
import time
from pathlib import Path

import pollux_opt.elastic as elastic
import torch
from torch.utils.data import Dataset

#: Learning rates each real optimizer step applied (this process; read by in-process tests).
APPLIED_LRS: list = []
#: A constant added to the reported loss to make it diverge.
DIVERGENCE_OFFSET = 1e9


def schedule(t: int) -> float:
    """The LambdaLR factor at schedule step ``t``."""
    return 1.0 / (1.0 + 0.1 * t)


class Indexed(Dataset):
    def __init__(self, n: int) -> None:
        gen = torch.Generator().manual_seed(7)
        self.x = torch.randn(n, 8, generator=gen)
        self.y = self.x @ torch.randn(8, generator=gen)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return i, self.x[i], self.y[i]


class RecordingSGD(torch.optim.SGD):
    def step(self, closure=None):
        APPLIED_LRS.append([g["lr"] for g in self.param_groups])
        return super().step(closure)


def main() -> None:
    cfg = elastic.job_config()
    torch.manual_seed(0)
    data = Indexed(cfg.get("samples", 512))
    loader = elastic.ElasticDataLoader(data, batch_size=16, shuffle=True, num_workers=cfg.get("num_workers", 0))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = RecordingSGD(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule) if cfg.get("schedule") else None
    counts = {"batches": 0, "epochs": 0}
    amp, device = cfg.get("amp"), elastic.device()
    scaler = None if amp is None else torch.amp.GradScaler(
        device.type, init_scale=amp["init_scale"], growth_interval=amp.get("growth_interval", 2000))
    held_out = (data.x[:128].to(device), data.y[:128].to(device))
    model = elastic.ElasticDataParallel(
        model, optimizer, scheduler=scheduler, extra={"counts": counts}, scaler=scaler,
        evaluate=lambda m: float(torch.nn.functional.mse_loss(m(held_out[0]).squeeze(1), held_out[1])),
    )
    trace = None
    if cfg.get("trace_dir"):
        trace = open(Path(cfg["trace_dir"]) / f"{os.getpid()}-{time.time_ns()}.txt", "a")
    for epoch in elastic.remaining_epochs_until(cfg.get("epochs", 3)):
        for idx, x, y in loader:
            if trace is not None:
                trace.write(f"{epoch} {' '.join(str(i) for i in idx.tolist())}\n")
                trace.flush()
            if cfg.get("raise_at_batch") is not None and counts["batches"] >= cfg["raise_at_batch"]:
                print(f"the user's own print before failing at batch {counts['batches']}")
                raise ValueError(f"deliberate failure in the user's loop at batch {counts['batches']}")
            if cfg.get("delay_s"):
                time.sleep(cfg["delay_s"])
            optimizer.zero_grad()
            half = torch.bfloat16 if device.type == "cpu" else torch.float16
            with torch.autocast(device.type, dtype=half, enabled=amp is not None):
                out = model(x).squeeze(1)
            loss = torch.nn.functional.mse_loss(out.float(), y)
            if cfg.get("diverge_at_batch") is not None and counts["batches"] >= cfg["diverge_at_batch"]:
                loss = loss + DIVERGENCE_OFFSET
            if amp is not None and amp.get("usual"):
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                model.backward(loss)
                optimizer.step()
            if cfg.get("schedule") == "batch":
                scheduler.step()
            counts["batches"] += 1
        if cfg.get("schedule") == "epoch":
            scheduler.step()
        counts["epochs"] += 1
