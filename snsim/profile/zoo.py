"""Model zoo: the paper's networks and a GPT, written here (no torchvision).

Names: ``alexnet``, ``vgg16``, ``resnet18``, ``resnet50``, ``resnet101``,
``resnet152``, ``resnet-N`` (bottleneck ResNets with the SuperNeurons release's
stage configurations; ``resnet-2500`` = [6, 32, 788, 6]), ``inception_v4``,
``densenet121``, ``gpt``.  Parameters follow a colon:
``gpt:layers=12,heads=12,width=768,vocab=50257``; GPT's sequence length is
its input shape (``--input-shape 1024``), not a parameter.

Every builder takes the per-sample input shape so that size-dependent layers
(AlexNet's and VGG's first fully connected layer) fit it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from snsim.errors import SnsimError

# Bottleneck stage configurations of the SuperNeurons release's test programs.
RESNET_STAGES: dict[int, tuple[int, int, int, int]] = {
    50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3), 254: (3, 16, 62, 3),
    506: (6, 32, 124, 6), 1010: (12, 64, 248, 12), 2498: (6, 32, 788, 6),
}
RESNET_ALIASES = {2500: 2498}  # "ResNet-2500" in the paper is 3 * 832 + 2 = 2498 layers


def _conv_out(size: int, k: int, s: int = 1, p: int = 0) -> int:
    return (size + 2 * p - k) // s + 1


def _need(ok: bool, model: str, shape) -> None:
    if not ok:
        raise SnsimError(f"input shape {list(shape)} is too small for {model}")


# --------------------------------------------------------------------- AlexNet
class AlexNet(nn.Module):
    """Krizhevsky et al. 2012 as in Caffe's model zoo: LRN after conv1/conv2, dropout."""

    def __init__(self, input_shape=(3, 227, 227), classes: int = 1000):
        super().__init__()
        c, h, w = input_shape
        self.features = nn.Sequential(
            nn.Conv2d(c, 96, 11, 4), nn.ReLU(inplace=True), nn.LocalResponseNorm(5, 1e-4, 0.75),
            nn.MaxPool2d(3, 2),
            nn.Conv2d(96, 256, 5, padding=2), nn.ReLU(inplace=True),
            nn.LocalResponseNorm(5, 1e-4, 0.75), nn.MaxPool2d(3, 2),
            nn.Conv2d(256, 384, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 384, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2))
        h, w = _conv_out(h, 11, 4), _conv_out(w, 11, 4)
        for _ in range(3):  # the three 3x3/2 max-pools (convs 2-5 keep the size)
            h, w = _conv_out(h, 3, 2), _conv_out(w, 3, 2)
        _need(h > 0 and w > 0, "alexnet", input_shape)
        self.classifier = nn.Sequential(
            nn.Linear(256 * h * w, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(4096, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


# ------------------------------------------------------------------------- VGG
class VGG16(nn.Module):
    """Simonyan & Zisserman 2014, configuration D."""

    CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
           512, 512, 512, "M")

    def __init__(self, input_shape=(3, 224, 224), classes: int = 1000):
        super().__init__()
        c, h, w = input_shape
        layers: list[nn.Module] = []
        for v in self.CFG:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
                h, w = h // 2, w // 2
            else:
                layers += [nn.Conv2d(c, v, 3, padding=1), nn.ReLU(inplace=True)]
                c = v
        _need(h > 0 and w > 0, "vgg16", input_shape)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Linear(512 * h * w, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(4096, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


# ---------------------------------------------------------------------- ResNet
def _bn_conv(cin, cout, k, s=1, p=0):
    return nn.Sequential(nn.Conv2d(cin, cout, k, s, p, bias=False), nn.BatchNorm2d(cout))


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin, width, stride):
        super().__init__()
        self.conv1 = _bn_conv(cin, width, 3, stride, 1)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _bn_conv(width, width, 3, 1, 1)
        self.down = (_bn_conv(cin, width, 1, stride) if stride != 1 or cin != width else None)

    def forward(self, x):
        y = self.conv2(self.relu(self.conv1(x)))
        return self.relu(y + (x if self.down is None else self.down(x)))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, width, stride):
        super().__init__()
        self.conv1 = _bn_conv(cin, width, 1)
        self.conv2 = _bn_conv(width, width, 3, stride, 1)
        self.conv3 = _bn_conv(width, 4 * width, 1)
        self.relu = nn.ReLU(inplace=True)
        self.down = (_bn_conv(cin, 4 * width, 1, stride)
                     if stride != 1 or cin != 4 * width else None)

    def forward(self, x):
        y = self.relu(self.conv1(x))
        y = self.conv3(self.relu(self.conv2(y)))
        return self.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    """He et al. 2016; a module called twice (the block's ReLU) makes two layers."""

    def __init__(self, block, stages, input_shape=(3, 224, 224), classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(input_shape[0], 64, 7, 2, 3, bias=False),
                                  nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], 64
        for i, n in enumerate(stages):
            width = 64 * 2**i
            for j in range(n):
                blocks.append(block(cin, width, 2 if i > 0 and j == 0 else 1))
                cin = width * block.expansion
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


# ---------------------------------------------------------------- Inception v4
class CBR(nn.Sequential):
    """conv (no bias) + batch norm + ReLU, the unit of Inception v4."""

    def __init__(self, cin, cout, k, s=1, p=0):
        super().__init__(nn.Conv2d(cin, cout, k, s, p, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True))


def _avg_branch(cin, cout):
    return nn.Sequential(nn.AvgPool2d(3, 1, 1, count_include_pad=False), CBR(cin, cout, 1))


class _Cat(nn.Module):
    """Branches on one input joined by channel concatenation."""

    def __init__(self, *branches):
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x):
        return torch.cat([b(x) for b in self.branches], 1)


class _Split(nn.Module):
    """A stem followed by two parallel heads, concatenated (Inception-C's 1x3/3x1)."""

    def __init__(self, stem, a, b):
        super().__init__()
        self.stem, self.a, self.b = stem, a, b

    def forward(self, x):
        y = self.stem(x)
        return torch.cat([self.a(y), self.b(y)], 1)


def _inception_a():
    return _Cat(CBR(384, 96, 1), nn.Sequential(CBR(384, 64, 1), CBR(64, 96, 3, 1, 1)),
                nn.Sequential(CBR(384, 64, 1), CBR(64, 96, 3, 1, 1), CBR(96, 96, 3, 1, 1)),
                _avg_branch(384, 96))


def _inception_b():
    return _Cat(CBR(1024, 384, 1),
                nn.Sequential(CBR(1024, 192, 1), CBR(192, 224, (1, 7), 1, (0, 3)),
                              CBR(224, 256, (7, 1), 1, (3, 0))),
                nn.Sequential(CBR(1024, 192, 1), CBR(192, 192, (7, 1), 1, (3, 0)),
                              CBR(192, 224, (1, 7), 1, (0, 3)), CBR(224, 224, (7, 1), 1, (3, 0)),
                              CBR(224, 256, (1, 7), 1, (0, 3))),
                _avg_branch(1024, 128))


def _inception_c():
    return _Cat(CBR(1536, 256, 1),
                _Split(CBR(1536, 384, 1), CBR(384, 256, (1, 3), 1, (0, 1)),
                       CBR(384, 256, (3, 1), 1, (1, 0))),
                _Split(nn.Sequential(CBR(1536, 384, 1), CBR(384, 448, (3, 1), 1, (1, 0)),
                                     CBR(448, 512, (1, 3), 1, (0, 1))),
                       CBR(512, 256, (1, 3), 1, (0, 1)), CBR(512, 256, (3, 1), 1, (1, 0))),
                _avg_branch(1536, 256))


class InceptionV4(nn.Module):
    """Szegedy et al. 2016 (Inception-v4, without the auxiliary head)."""

    def __init__(self, input_shape=(3, 299, 299), classes: int = 1000):
        super().__init__()
        _need(min(input_shape[1:]) >= 75, "inception_v4", input_shape)
        self.stem = nn.Sequential(
            CBR(input_shape[0], 32, 3, 2), CBR(32, 32, 3), CBR(32, 64, 3, 1, 1),
            _Cat(nn.MaxPool2d(3, 2), CBR(64, 96, 3, 2)),
            _Cat(nn.Sequential(CBR(160, 64, 1), CBR(64, 96, 3)),
                 nn.Sequential(CBR(160, 64, 1), CBR(64, 64, (1, 7), 1, (0, 3)),
                               CBR(64, 64, (7, 1), 1, (3, 0)), CBR(64, 96, 3))),
            _Cat(CBR(192, 192, 3, 2), nn.MaxPool2d(3, 2)))
        reduction_a = _Cat(CBR(384, 384, 3, 2),
                           nn.Sequential(CBR(384, 192, 1), CBR(192, 224, 3, 1, 1),
                                         CBR(224, 256, 3, 2)), nn.MaxPool2d(3, 2))
        reduction_b = _Cat(nn.Sequential(CBR(1024, 192, 1), CBR(192, 192, 3, 2)),
                           nn.Sequential(CBR(1024, 256, 1), CBR(256, 256, (1, 7), 1, (0, 3)),
                                         CBR(256, 320, (7, 1), 1, (3, 0)), CBR(320, 320, 3, 2)),
                           nn.MaxPool2d(3, 2))
        self.body = nn.Sequential(*[_inception_a() for _ in range(4)], reduction_a,
                                  *[_inception_b() for _ in range(7)], reduction_b,
                                  *[_inception_c() for _ in range(3)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(0.2)
        self.fc = nn.Linear(1536, classes)

    def forward(self, x):
        return self.fc(self.drop(torch.flatten(self.pool(self.body(self.stem(x))), 1)))


# -------------------------------------------------------------------- DenseNet
class _DenseLayer(nn.Module):
    def __init__(self, cin, growth, bn_size):
        super().__init__()
        self.f = nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(inplace=True),
                               nn.Conv2d(cin, bn_size * growth, 1, bias=False),
                               nn.BatchNorm2d(bn_size * growth), nn.ReLU(inplace=True),
                               nn.Conv2d(bn_size * growth, growth, 3, 1, 1, bias=False))

    def forward(self, feats):
        return self.f(torch.cat(feats, 1))


class _DenseBlock(nn.Module):
    def __init__(self, n, cin, growth, bn_size):
        super().__init__()
        self.layers = nn.ModuleList(_DenseLayer(cin + i * growth, growth, bn_size)
                                    for i in range(n))

    def forward(self, x):
        feats = [x]
        for layer in self.layers:
            feats.append(layer(feats))
        return torch.cat(feats, 1)


class DenseNet(nn.Module):
    """Huang et al. 2017 (DenseNet-BC); each dense layer concatenates all before it."""

    def __init__(self, blocks=(6, 12, 24, 16), growth=32, input_shape=(3, 224, 224),
                 classes: int = 1000):
        super().__init__()
        c = 2 * growth
        mods: list[nn.Module] = [nn.Conv2d(input_shape[0], c, 7, 2, 3, bias=False),
                                 nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
        for i, n in enumerate(blocks):
            mods.append(_DenseBlock(n, c, growth, 4))
            c += n * growth
            if i < len(blocks) - 1:
                mods += [nn.BatchNorm2d(c), nn.ReLU(inplace=True),
                         nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2, 2)]
                c //= 2
        mods += [nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1)]
        self.features = nn.Sequential(*mods)
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


# ------------------------------------------------------------------------- GPT
class CausalAttention(nn.Module):
    """softmax(QK^T / sqrt(d) + causal mask) V over heads; one ``attention`` layer."""

    snsim_leaf = True
    snsim_kind = "attention"

    def __init__(self, heads: int):
        super().__init__()
        self.heads = heads

    def forward(self, qkv):
        b, t, w3 = qkv.shape
        q, k, v = qkv.view(b, t, 3, self.heads, w3 // (3 * self.heads)).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        mask = torch.ones(t, t, dtype=torch.bool, device=qkv.device).triu(1)
        att = F.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        return (att @ v).transpose(1, 2).reshape(b, t, w3 // 3)


class GPTBlock(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.attn = nn.Linear(width, 3 * width), CausalAttention(heads)
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.proj(self.attn(self.qkv(self.ln1(x))))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A GPT-2-style decoder (pre-LN blocks); input is token ids of shape (batch, seq)."""

    def __init__(self, layers=12, heads=12, width=768, seq=1024, vocab=50257):
        super().__init__()
        if width % heads:
            raise SnsimError(f"gpt: width {width} is not a multiple of heads {heads}")
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(seq, width))
        self.blocks = nn.Sequential(*[GPTBlock(width, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx):
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos)))


# -------------------------------------------------------------------- registry
@dataclass(frozen=True)
class ZooEntry:
    name: str
    describe: str
    input_shape: tuple[int, ...]
    build: Callable[..., nn.Module]   # build(input_shape, **params)
    params: dict
    input_dtype: str = "float32"


def _resnet(n: int):
    def build(shape, **_):
        if n in (18, 34):
            return ResNet(BasicBlock, (2, 2, 2, 2) if n == 18 else (3, 4, 6, 3), shape)
        return ResNet(Bottleneck, RESNET_STAGES[n], shape)
    return build


def _gpt(shape, layers=12, heads=12, width=768, vocab=50257):
    return GPT(layers, heads, width, shape[0], vocab)


ZOO: dict[str, ZooEntry] = {e.name: e for e in (
    ZooEntry("alexnet", "AlexNet (Caffe): 5 conv, LRN, 3 fc with dropout", (3, 227, 227),
             lambda s, **_: AlexNet(s), {}),
    ZooEntry("vgg16", "VGG-16 (configuration D), dropout in the classifier", (3, 224, 224),
             lambda s, **_: VGG16(s), {}),
    ZooEntry("resnet18", "ResNet-18, basic blocks [2, 2, 2, 2]", (3, 224, 224), _resnet(18), {}),
    *[ZooEntry(f"resnet{n}", f"ResNet-{n}, bottleneck blocks {list(RESNET_STAGES[n])}",
               (3, 227, 227), _resnet(n), {}) for n in (50, 101, 152)],
    ZooEntry("resnet-N", "bottleneck ResNet with a SuperNeurons stage config, N in "
             + ", ".join(str(n) for n in RESNET_STAGES) + " (2500 = 2498: [6, 32, 788, 6])",
             (3, 227, 227), lambda s, **_: None, {}),
    ZooEntry("inception_v4", "Inception-v4 (no auxiliary head)", (3, 299, 299),
             lambda s, **_: InceptionV4(s), {}),
    ZooEntry("densenet121", "DenseNet-121 (BC, growth 32, blocks [6, 12, 24, 16])",
             (3, 224, 224), lambda s, **_: DenseNet(input_shape=s), {}),
    ZooEntry("gpt", "GPT-2-style decoder; input shape is (seq,) token ids", (1024,), _gpt,
             {"layers": 12, "heads": 12, "width": 768, "vocab": 50257}, "int64"),
)}


def lookup(name: str) -> tuple[ZooEntry, dict]:
    """Resolve ``name[:k=v,...]`` to a zoo entry and its parameters."""
    base, _, rest = name.partition(":")
    params: dict = {}
    for item in filter(None, rest.split(",")):
        key, eq, val = item.partition("=")
        if not eq or not val.lstrip("-").isdigit():
            raise SnsimError(f"bad model parameter {item!r} in {name!r}: use key=integer")
        params[key.strip()] = int(val)
    if base.startswith("resnet-"):
        digits = base[len("resnet-"):]
        n = RESNET_ALIASES.get(int(digits), int(digits)) if digits.isdigit() else -1
        if n not in RESNET_STAGES and n not in (18, 34):
            raise SnsimError(f"unknown ResNet depth {base!r}; resnet-N takes N in 18, 34, "
                             + ", ".join(str(k) for k in RESNET_STAGES) + ", 2500")
        entry = ZOO["resnet-N"]
        return ZooEntry(f"resnet-{digits}", entry.describe, entry.input_shape, _resnet(n),
                        {}), params
    if base not in ZOO or base == "resnet-N":
        raise SnsimError(f"unknown model {base!r}; choose one of {', '.join(ZOO)} "
                         "or give package.module:function (see snsim profile --list-models)")
    entry = ZOO[base]
    unknown = set(params) - set(entry.params)
    if unknown:
        raise SnsimError(f"model {base!r} has no parameter {sorted(unknown)[0]!r}"
                         + (f"; it takes {', '.join(entry.params)}" if entry.params else ""))
    return entry, params


def table() -> str:
    rows = []
    for e in ZOO.values():
        ps = ",".join(f"{k}={v}" for k, v in e.params.items())
        rows.append(f"{e.name:13} input {'x'.join(map(str, e.input_shape)):>11}"
                    f"{' (' + e.input_dtype + ')' if e.input_dtype != 'float32' else ''}  "
                    f"{e.describe}" + (f"  [params: {e.name}:{ps}]" if ps else ""))
    return "\n".join(rows)
