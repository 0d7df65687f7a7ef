"""A character-level language model of Python source code, trained for a fixed
number of epochs: a map-style Dataset of text windows, a DataLoader with its
own ``collate_fn``, Adam, and a per-epoch history of the validation loss.

``charlm_plain.py`` is the ordinary PyTorch script; ``charlm.py`` is the same
script with pollux-opt's lines added (``diff`` the two), an elastic job that
``workload.json`` runs (see ``docs/user-jobs.md``).  Either trains on its own
with ``python <file>``.
"""

import logging
import sysconfig
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

EPOCHS = 2
BATCH_SIZE = 64
LR = 2e-3
CONTEXT = 16
CHARS = 40_000
VAL_FRACTION = 0.1
#: Standard-library modules whose source is the corpus (pure Python, in every CPython).
SOURCES = ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py", "bisect.py", "heapq.py", "string.py", "calendar.py")

log = logging.getLogger("charlm")


def read_text() -> torch.Tensor:
    """The corpus as ASCII codes (others become '?')."""
    root = Path(sysconfig.get_paths()["stdlib"])
    text = b"".join((root / name).read_bytes() for name in SOURCES if (root / name).is_file())[:CHARS]
    return torch.tensor([b if b < 128 else 63 for b in text])


class Windows(Dataset):
    """Every window of CONTEXT characters and the character after it."""

    def __init__(self, text: torch.Tensor) -> None:
        self.text = text

    def __len__(self) -> int:
        return len(self.text) - CONTEXT

    def __getitem__(self, i):
        return self.text[i : i + CONTEXT + 1]


def collate(windows):
    batch = torch.stack(windows)
    return batch[:, :-1], batch[:, -1]


class CharMLP(nn.Module):
    def __init__(self, embedding: int = 24, hidden: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(128, embedding)
        self.net = nn.Sequential(nn.Linear(CONTEXT * embedding, hidden), nn.ReLU(), nn.Linear(hidden, 128))

    def forward(self, ids):
        return self.net(self.embed(ids).flatten(1))


@torch.no_grad()
def val_loss(model, text: torch.Tensor) -> float:
    x, y = collate(list(text.unfold(0, CONTEXT + 1, 1)))
    device = next(model.parameters()).device  # evaluate where the model is: a GPU, or the CPU
    return nn.functional.cross_entropy(model(x.to(device)), y.to(device)).item()


def main() -> None:
    torch.manual_seed(0)
    text = read_text()
    split = int(len(text) * (1 - VAL_FRACTION))
    train, val = Windows(text[:split]), text[split:]
    loader = DataLoader(train, batch_size=BATCH_SIZE, shuffle=True, collate_fn=collate)
    model = CharMLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    history = {"val_loss": []}
    for epoch in range(EPOCHS):
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        history["val_loss"].append(val_loss(model, val))
        log.info("epoch %d: validation loss %.3f nats", epoch, history["val_loss"][-1])


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
