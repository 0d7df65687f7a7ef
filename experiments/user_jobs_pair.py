"""One model on one dataset defined both ways, for measuring what the
keep-your-loop wrapper (:mod:`pollux_opt.elastic`) costs per step against the
builder protocol (:class:`pollux_opt.runtime.JobParts`), and the example
scripts of ``examples/user-jobs/`` made endless, for profiling their step times.

Imported by worker processes by entry (``"user_jobs_pair.py:loop_main"`` from
``experiments/``), so everything here is a top-level function.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: Samples, features and hidden width of the pair's MLP regression: steps of a
#: few milliseconds at the measured batches, the scale of the example jobs.
SAMPLES, FEATURES, WIDTH = 16384, 32, 256
#: Epochs of the endless variants: more than any measurement reaches.
ENDLESS_EPOCHS = 10**6
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "user-jobs"


def _data():
    import torch

    gen = torch.Generator().manual_seed(11)
    x = torch.randn(SAMPLES, FEATURES, generator=gen)
    y = torch.sin(x @ torch.randn(FEATURES, generator=gen)) + 0.1 * torch.randn(SAMPLES, generator=gen)
    return x, y


def _model():
    import torch

    return torch.nn.Sequential(torch.nn.Linear(FEATURES, WIDTH), torch.nn.Tanh(), torch.nn.Linear(WIDTH, WIDTH),
                               torch.nn.Tanh(), torch.nn.Linear(WIDTH, 1))


def build(ctx):
    """The builder protocol."""
    import torch

    from pollux_opt.runtime import JobParts

    x, y = _data()
    model = _model()

    def loss(m, batch):
        return torch.nn.functional.mse_loss(m(batch[0]).squeeze(1), batch[1])

    return JobParts(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01), train_size=SAMPLES,
                    get_batch=lambda idx: (x[idx], y[idx]), loss=loss,
                    evaluate=lambda m: float(loss(m, (x[:512], y[:512]))))


class Tensors:
    """A map-style dataset of two tensors that also fetches a whole batch at once."""

    def __init__(self, x, y) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __getitems__(self, idx):
        import torch

        idx = torch.as_tensor(idx)  # once, rather than in each of the two indexings
        return self.x[idx], self.y[idx]


def keep_batch(batch):
    """The collate_fn of a dataset whose ``__getitems__`` returns the batch."""
    return batch


def loop_main() -> None:
    """The same job as a user's loop."""
    import torch

    import pollux_opt.elastic as elastic

    x, y = _data()
    loader = elastic.ElasticDataLoader(Tensors(x, y), batch_size=64, shuffle=True, collate_fn=keep_batch)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model = elastic.ElasticDataParallel(model, optimizer, evaluate=lambda m: 0.0)
    for _ in elastic.remaining_epochs_until(ENDLESS_EPOCHS):
        for xb, yb in loader:
            optimizer.zero_grad()
            model.backward(torch.nn.functional.mse_loss(model(xb).squeeze(1), yb))
            optimizer.step()


def _endless(module: str):
    from pollux_opt.runtime.spec import import_from

    mod = import_from(module, str(EXAMPLES))
    mod.EPOCHS = ENDLESS_EPOCHS
    return mod


def digits_endless() -> None:
    """``examples/user-jobs/digits_cnn.py`` with endless epochs (for profiling)."""
    _endless("digits_cnn").main()


def charlm_endless() -> None:
    """``examples/user-jobs/charlm.py`` with endless epochs (for profiling)."""
    _endless("charlm").main()


if __name__ == "__main__":  # pragma: no cover - not a script
    sys.exit("import this module; see experiments/user_jobs.py")
