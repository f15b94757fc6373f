"""Small models of the families users train, each as a ``--model tests.families:NAME`` function.

Each function returns ``(module, example)``: the example is the whole batch
(its dtype and shape are the input's).  They cover the patterns the fidelity
issue names: integer token ids, layers returning tuples (LSTM, GRU,
MultiheadAttention), whole ``nn.Module`` blocks (TransformerEncoderLayer),
a ViT class token (``expand`` of a parameter), a tied decoder weight used
through ``W.t()``, several outputs, ``scaled_dot_product_attention``,
residual joins, ``chunk`` views, in-place activations, non-contiguous
inputs to a linear layer and a module called twice.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, SEQ, BATCH, WIDTH = 128, 16, 8, 64


def _tokens(batch: int = BATCH, seq: int = SEQ) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, VOCAB, (batch, seq), generator=gen)


def _floats(*shape: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(*shape, generator=gen)


class LSTMLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.rnn = nn.LSTM(WIDTH, WIDTH, batch_first=True)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.head(h)


def lstm_lm():
    return LSTMLM(), _tokens()


class GRUClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(16, WIDTH, batch_first=True)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x):
        out, h = self.rnn(x)
        return self.head(out[:, -1])


def gru_classifier():
    return GRUClassifier(), _floats(BATCH, SEQ, 16)


class MHAClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, 4, batch_first=True)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x):
        h = self.proj(x)
        a, _ = self.attn(h, h, h)
        return self.head((h + a).mean(dim=1))


def mha_classifier():
    return MHAClassifier(), _floats(BATCH, SEQ, 16)


class EncoderClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.enc = nn.TransformerEncoderLayer(WIDTH, 4, 128, dropout=0.0, batch_first=True)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x):
        return self.head(self.enc(self.emb(x)).mean(dim=1))


def encoder_classifier():
    return EncoderClassifier(), _tokens()


class TinyViT(nn.Module):
    def __init__(self, patch: int = 4, image: int = 16):
        super().__init__()
        self.patch = nn.Conv2d(3, WIDTH, patch, stride=patch)
        n = (image // patch) ** 2
        self.cls_token = nn.Parameter(torch.randn(1, 1, WIDTH) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, n + 1, WIDTH) * 0.02)
        self.norm = nn.LayerNorm(WIDTH)
        self.fc1 = nn.Linear(WIDTH, 128)
        self.fc2 = nn.Linear(128, WIDTH)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x):
        h = self.patch(x).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        h = torch.cat([cls, h], dim=1) + self.pos
        h = h + self.fc2(F.gelu(self.fc1(self.norm(h))))
        return self.head(h[:, 0])


def tiny_vit():
    return TinyViT(), _floats(BATCH, 3, 16, 16)


class TiedLM(nn.Module):
    """Decoder weight tied to the embedding, used as ``F.linear(h, W.t())``."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.mix = nn.Linear(WIDTH, WIDTH)
        self.out_t = nn.Parameter(torch.randn(WIDTH, VOCAB) * 0.1)

    def forward(self, x):
        h = torch.tanh(self.mix(self.emb(x)))
        return F.linear(h, self.out_t.t())


def tied_lm():
    return TiedLM(), _tokens()


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, WIDTH), nn.ReLU())
        self.a = nn.Linear(WIDTH, 10)
        self.b = nn.Linear(WIDTH, 3)

    def forward(self, x):
        h = self.body(x)
        return self.a(h), self.b(h)


def two_heads():
    return TwoHeads(), _floats(BATCH * 4, 16)


class SDPAModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 3 * WIDTH)
        self.out = nn.Linear(WIDTH, 10)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, WIDTH // 4).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(a.transpose(1, 2).reshape(b, t, WIDTH))


def sdpa_model():
    return SDPAModel(), _floats(BATCH, SEQ, 16)


class ResidualMLP(nn.Module):
    def __init__(self, depth: int = 3):
        super().__init__()
        self.inp = nn.Linear(16, WIDTH)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
                                    for _ in range(depth))
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x):
        h = self.inp(x)
        for blk in self.blocks:
            h = h + blk(h)
        return self.head(h)


def residual_mlp():
    return ResidualMLP(), _floats(BATCH * 4, 16)


class GatedMLP(nn.Module):
    """GLU: ``chunk`` makes two views whose gradients are halves of one buffer."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 2 * WIDTH)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x):
        a, b = self.up(x).chunk(2, dim=-1)
        return self.head(a * torch.sigmoid(b))


def gated_mlp():
    return GatedMLP(), _floats(BATCH * 4, 16)


class InplaceCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.act = nn.LeakyReLU(0.1, inplace=True)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        h = self.act(self.c1(x))
        h = F.relu(self.c2(h), inplace=True)
        return self.head(h.mean(dim=(2, 3)))


def inplace_cnn():
    return InplaceCNN(), _floats(BATCH, 3, 16, 16)


class TransposedLinear(nn.Module):
    """A linear layer on a transposed (non-contiguous) input."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(SEQ, 24)
        self.b = nn.Linear(16, 10)

    def forward(self, x):
        h = self.a(x.transpose(1, 2))            # (B, 16, 24)
        return self.b(torch.relu(h).transpose(1, 2)).mean(dim=1)


def transposed_linear():
    return TransposedLinear(), _floats(BATCH, SEQ, 16)


class SharedTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, WIDTH)
        self.shared = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x):
        h = torch.relu(self.shared(self.inp(x)))
        return self.head(torch.relu(self.shared(h)))


def shared_twice():
    return SharedTwice(), _floats(BATCH * 4, 16)


FAMILIES = ("lstm_lm", "gru_classifier", "mha_classifier", "encoder_classifier", "tiny_vit",
            "tied_lm", "two_heads", "sdpa_model", "residual_mlp", "gated_mlp", "inplace_cnn",
            "transposed_linear", "shared_twice")


class MutatedVariable(nn.Module):
    """``h.relu_()`` whose result is dropped: later code reads the variable."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        h = self.c1(x)
        h.relu_()
        return self.head(h.mean(dim=(2, 3)))


def mutated_variable():
    return MutatedVariable(), _floats(BATCH, 3, 16, 16)


class MutatedThroughView(nn.Module):
    """Reads the old value's view after an in-place op changed it: not capturable."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        h = self.fc(x)
        v = h.view(-1, 8, 2)
        h = F.relu(h, inplace=True)
        return self.head(torch.cat([h, v.flatten(1)], dim=1))


def mutated_through_view():
    return MutatedThroughView(), _floats(BATCH * 4, 16)


class InplaceInput(nn.Module):
    """In place on the input batch (``relu_``), and ``h += 1`` (``add_`` in eager)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        x = F.relu(x, inplace=True)
        h = self.fc(x)
        h += 1.0
        return self.head(torch.sigmoid(h))


def inplace_input():
    return InplaceInput(), _floats(BATCH * 4, 16)


class HardswishCNN(nn.Module):
    """In-place Hardswish keeps a copy of its input (a saved extra): a swapping
    policy offloads it, frees it and brings it back for the backward."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 16, 3, padding=1)
        self.h = nn.Hardswish(inplace=True)
        self.b = nn.Conv2d(16, 16, 3, padding=1)
        self.h2 = nn.Hardswish(inplace=True)
        self.c = nn.Conv2d(16, 16, 3, padding=1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(self.c(self.h2(self.b(self.h(self.a(x))))).mean((2, 3)))


def hardswish_cnn():
    return HardswishCNN(), _floats(BATCH, 3, 32, 32)


class TokenMixer(nn.Module):
    """gMLP's mixing over tokens without the split: a linear layer on a transposed
    (non-contiguous) LayerNorm output, transposed back.  Its backward receives its
    output gradient through a bias's ``add`` and a reshape that copies it."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, WIDTH // 2)
        self.norm = nn.LayerNorm(WIDTH // 2)
        self.proj = nn.Linear(SEQ, SEQ)
        self.head = nn.Linear(WIDTH // 2, 10)

    def forward(self, x):
        h = self.up(x)
        v = self.proj(self.norm(h).transpose(1, 2)).transpose(1, 2)
        return self.head((h * v).mean(1))


def token_mixer():
    return TokenMixer(), _floats(BATCH, SEQ, 16)


class SpatialGating(nn.Module):
    """gMLP's spatial gating unit: ``chunk`` halves read by two layers (the gate
    and a LayerNorm), the LayerNorm's output mixed over tokens as in
    :class:`TokenMixer`."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, WIDTH)
        self.norm = nn.LayerNorm(WIDTH // 2)
        self.proj = nn.Linear(SEQ, SEQ)
        self.head = nn.Linear(WIDTH // 2, 10)

    def forward(self, x):
        u, v = self.up(x).chunk(2, dim=-1)
        v = self.proj(self.norm(v).transpose(1, 2)).transpose(1, 2)
        return self.head((u * v).mean(1))


def spatial_gating():
    return SpatialGating(), _floats(BATCH, SEQ, 16)
