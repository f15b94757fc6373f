"""Tiny PyTorch models for executor and validation tests (``toymodels:NAME``)."""

import torch
import torch.nn as nn


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8),
                                  nn.ReLU(inplace=True))
        self.a = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8),
                               nn.ReLU(inplace=True), nn.Conv2d(8, 8, 3, padding=1),
                               nn.BatchNorm2d(8))
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(x + self.a(x))
        return self.fc(torch.flatten(self.pool(x), 1))


class Concat(nn.Module):
    def __init__(self):
        super().__init__()
        self.b1 = nn.Conv2d(3, 4, 1)
        self.b2 = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 5))

    def forward(self, x):
        return self.head(torch.cat([self.b1(x), self.b2(x)], dim=1))


class DropoutBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 64), nn.BatchNorm1d(64),
                                 nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 32), nn.Tanh(),
                                 nn.Dropout(0.3), nn.Linear(32, 10))

    def forward(self, x):
        return self.net(x)


def residual():
    return Residual(), (3, 16, 16)


def concat():
    return Concat(), (3, 16, 16)


def dropout_bn():
    return DropoutBN(), (3, 16, 16)


def fractional_shape():
    """A model function whose input shape is not integers (bad input)."""
    return nn.Linear(4, 2), (4.5,)


class _Branches(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        if x.sum() > 0:   # data-dependent control flow: fx cannot trace it
            return self.fc(x)
        return self.fc(-x)


def data_dependent():
    return _Branches(), torch.zeros(2, 4)
