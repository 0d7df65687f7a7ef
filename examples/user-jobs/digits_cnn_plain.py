"""A small CNN on scikit-learn's 8x8 digits: a map-style Dataset, a DataLoader,
SGD with momentum and a cosine learning-rate schedule over the epochs.

``digits_cnn_plain.py`` is the ordinary PyTorch script; ``digits_cnn.py`` is the
same script with pollux-opt's lines added (``diff`` the two), an elastic job
that ``workload.json`` runs (see ``docs/user-jobs.md``).  Either trains on its
own with ``python <file>``.
"""

import logging

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, Dataset

EPOCHS = 30
BATCH_SIZE = 32
LR = 0.05
TEST_FRACTION = 0.2

log = logging.getLogger("digits_cnn")


class Digits(Dataset):
    """The 1797 digits, split into a training and a test part."""

    def __init__(self, train: bool) -> None:
        x, y = load_digits(return_X_y=True)
        split = int(len(y) * (1 - TEST_FRACTION))
        part = slice(0, split) if train else slice(split, None)
        self.x = torch.tensor(x[part] / 16.0, dtype=torch.float32).reshape(-1, 1, 8, 8)
        self.y = torch.tensor(y[part])

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 16, 64), nn.ReLU(), nn.Linear(64, 10),
    )


@torch.no_grad()
def accuracy(model, data: Digits) -> float:
    device = next(model.parameters()).device  # evaluate where the model is: a GPU, or the CPU
    model.eval()
    correct = (model(data.x.to(device)).argmax(dim=1) == data.y.to(device)).float().mean().item()
    model.train()
    return correct


def main() -> None:
    torch.manual_seed(0)
    train, test = Digits(train=True), Digits(train=False)
    loader = DataLoader(train, batch_size=BATCH_SIZE, shuffle=True)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=EPOCHS)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(EPOCHS):
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
        scheduler.step()
        log.info("epoch %d: test accuracy %.3f", epoch, accuracy(model, test))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
