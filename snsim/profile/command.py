"""``snsim profile``: record a trace from a PyTorch model, or model one for a preset.

Imported by ``snsim/cli.py`` when it builds its parser, so nothing here
imports torch at module level: ``snsim --help`` works without torch.
"""

from __future__ import annotations

import argparse
import sys

from snsim.errors import SnsimError, require_torch
from snsim.fileio import check_writable
from snsim.training import AMPS, GRADS, OPTIMIZERS, Training


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Profile a PyTorch model into an snsim.trace/1 file: measured "
                          "(--device cpu|cuda) or modeled on a device preset (--device-model).")
    parser.add_argument("--model", metavar="NAME|package.module:function",
                        help="a zoo model (see --list-models; parameters as gpt:layers=4,"
                             "heads=4,width=256) or a function returning an nn.Module "
                             "(optionally with an example batch or its input shape); the "
                             "current directory is importable")
    parser.add_argument("--batch", type=int,
                        help="batch size (default: the example batch the model function "
                             "returns, if it does)")
    parser.add_argument("--input-shape", metavar="C,H,W",
                        help="per-sample input shape, e.g. 3,224,224 (default: the model's)")
    parser.add_argument("--input-dtype", metavar="DTYPE",
                        help="input dtype of a package.module:function model without an "
                             "example: float32 (default), float16, bfloat16, float64, int64 "
                             "or int32 (token ids below the smallest nn.Embedding's size)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="measure on this device (default: cpu)")
    parser.add_argument("--device-model", metavar="PRESET",
                        help="model the trace for a device preset instead of measuring "
                             "(see --list-device-models)")
    parser.add_argument("--repeats", type=int, default=10,
                        help="timed runs per layer (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed runs before timing (default: %(default)s)")
    parser.add_argument("--optimizer", choices=OPTIMIZERS,
                        help="record this optimizer (torch.optim defaults; momentum = SGD "
                             "with 0.9): its state and a measured step end the iteration; "
                             "default: no record (sgd as before: no state, no step)")
    parser.add_argument("--amsgrad", action="store_true",
                        help="Adam/AdamW with amsgrad (a third state buffer)")
    parser.add_argument("--grads", choices=GRADS,
                        help="record the gradient lifetime: resident (default) or "
                             "set-to-none (born in backward, kept to the optimizer step)")
    parser.add_argument("--amp", choices=AMPS,
                        help="profile under torch.autocast (bf16 or fp16): activations in "
                             "the dtypes autocast makes, its weight casts counted; modeled "
                             "traces apply autocast's rules on fake tensors and price "
                             "half-precision kernels at the preset's rate; default: off")
    parser.add_argument("--out", metavar="TRACE.json", help="trace file to write")
    parser.add_argument("--no-progress", action="store_true",
                        help="hide the progress bar (it is off anyway when stderr is not a "
                             "terminal)")
    parser.add_argument("--list-models", action="store_true", help="list the model zoo")
    parser.add_argument("--list-device-models", action="store_true",
                        help="list device presets with their numbers and sources")


def is_function(spec: str) -> bool:
    return ":" in spec and "=" not in spec.partition(":")[2]


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    """``"3,224,224"`` -> ``(3, 224, 224)``; :class:`SnsimError` on anything else."""
    if text is None:
        return None
    parts = [p.strip() for p in text.replace("x", ",").split(",")]
    if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise SnsimError(f"bad --input-shape {text!r}: use positive integers separated by "
                         "commas, e.g. 3,224,224")
    return tuple(int(p) for p in parts)


def check_model(spec: str, shape: tuple[int, ...] | None) -> None:
    """A zoo model name, its parameters and its input shape's length, checked
    without building anything (a ``package.module:function`` is left to the
    import).  Needs torch (the zoo defines modules)."""
    if ":" in spec and "=" not in spec.partition(":")[2]:
        return
    from snsim.profile import zoo

    entry, _ = zoo.lookup(spec)
    if shape is not None and len(shape) != len(entry.input_shape):
        raise SnsimError(f"model {entry.name} takes an input shape of {len(entry.input_shape)} "
                         f"numbers like {','.join(map(str, entry.input_shape))}, got "
                         f"{','.join(map(str, shape))}")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "list_device_models", False):
        from snsim import devices

        print(devices.table())
        return 0
    if getattr(args, "list_models", False):
        require_torch("snsim profile")
        from snsim.profile import zoo

        print(zoo.table())
        return 0
    missing = [f"--{k}" for k in ("model", "out") if getattr(args, k, None) is None]
    if args.model is not None and getattr(args, "batch", None) is None \
            and not is_function(args.model):
        missing.insert(1, "--batch")
    if missing:
        raise SnsimError(f"snsim profile needs {', '.join(missing)} "
                         "(or --list-models / --list-device-models)")
    shape = parse_shape(args.input_shape)
    # the profiler's own checks, made here before torch is imported or a model built
    if args.batch is not None and args.batch < 1:
        raise SnsimError(f"--batch must be at least 1, got {args.batch}")
    if args.repeats < 1 or args.warmup < 0:
        raise SnsimError(f"--repeats must be >= 1 and --warmup >= 0, got {args.repeats}, "
                         f"{args.warmup}")
    if args.device_model is not None:
        from snsim import devices

        devices.get(args.device_model)
        if args.device is not None:
            raise SnsimError(f"--device-model {args.device_model} models a device; it cannot "
                             f"be combined with --device {args.device} (measured mode)")
    training = None
    optimizer, grads = getattr(args, "optimizer", None), getattr(args, "grads", None)
    amsgrad, amp = getattr(args, "amsgrad", False), getattr(args, "amp", None)
    if optimizer is not None or grads is not None or amsgrad or amp is not None:
        if amsgrad and optimizer not in ("adam", "adamw"):
            raise SnsimError("--amsgrad needs --optimizer adam or adamw")
        training = Training(optimizer=optimizer or "sgd", amsgrad=amsgrad,
                            grads=grads or "resident", amp=amp or "off")
    check_writable(args.out)
    require_torch("snsim profile")
    from snsim.profile import profiler

    doc = profiler.profile(args.model, args.batch, shape, device=args.device,
                           device_model=args.device_model, repeats=args.repeats,
                           warmup=args.warmup,
                           progress=not args.no_progress and sys.stderr.isatty(),
                           input_dtype=getattr(args, "input_dtype", None),
                           training=training)
    profiler.write(doc, args.out)
    src = doc["source"]
    total = sum(layer["fwd_ms"] + layer["bwd_ms"] for layer in doc["layers"])
    line = (f"wrote {args.out}: {doc['model']} batch {doc['batch']}, {len(doc['layers'])} layers, "
            f"{src['kind']} on {src.get('device_model') or src['device']}, "
            f"layers fwd+bwd {total:.3f} ms")
    if "step_ms" in src:
        line += f", plain training step {src['step_ms']:.3f} ms"
    print(line)
    return 0
