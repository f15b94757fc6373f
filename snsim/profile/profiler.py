"""Model -> trace document, in measured or modeled mode (the profiler's one entry point).

:func:`profile` resolves the model (zoo name or ``package.module:function``),
builds it on the device (``meta`` for modeled mode), captures its layers
(:mod:`~snsim.torchgraph.capture`), times them (:mod:`~snsim.profile.measure`) or
models them (:mod:`~snsim.profile.modeled`), and returns a validated
``snsim.trace/1`` document.  :func:`write` writes it whole, compactly (one
layer per line).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib
import json
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from snsim import __version__
from snsim.errors import SnsimError
from snsim.fileio import write_atomic
from snsim.torchgraph import capture as cap
from snsim.torchgraph.amp import autocast
from snsim import devices
from snsim.profile import zoo
from snsim.trace import SCHEMA, from_dict


@dataclass
class ModelSpec:
    name: str
    model: nn.Module
    input_shape: tuple[int, ...]
    input_dtype: torch.dtype
    vocab: int = 0  # integer inputs draw from [0, vocab)
    example: torch.Tensor | None = None  # the whole batch, when the model function gave it


INPUT_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32}


def _importable_cwd() -> None:
    """``--model mymod:fn`` finds ``mymod.py`` in the current directory, as ``python -m`` would."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def _import_model(spec: str, input_shape, device: torch.device,
                  input_dtype: str | None = None) -> ModelSpec:
    mod_name, _, fn_name = spec.partition(":")
    _importable_cwd()
    try:
        module = importlib.import_module(mod_name)
    except Exception as exc:  # ImportError, or the module failing on import
        raise SnsimError(f"cannot import module {mod_name!r} for --model {spec!r}: "
                         f"{type(exc).__name__}: {exc}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise SnsimError(f"module {mod_name!r} has no function {fn_name!r} (--model {spec!r})")
    try:
        with device:
            made = fn()
    except SnsimError:
        raise
    except Exception as exc:
        raise SnsimError(f"{spec} raised {type(exc).__name__}: {exc}") from None
    second = None
    if isinstance(made, tuple) and len(made) == 2:
        made, second = made
    if not isinstance(made, nn.Module):
        raise SnsimError(f"{spec} returned {type(made).__name__}, not a torch.nn.Module "
                         "(or a (module, example batch) or (module, input_shape) pair)")
    if isinstance(second, (tuple, list)) and second and all(
            isinstance(t, torch.Tensor) for t in second):
        if len(second) > 1:
            raise SnsimError(f"{spec} gives {len(second)} example tensors; profile supports "
                             "models with one input tensor")
        second = second[0]
    if isinstance(second, torch.Tensor):
        return _with_example(spec, made, second, input_shape, input_dtype)
    shape = None
    if second is not None:
        try:
            if isinstance(second, (str, bytes)) or any(
                    isinstance(s, bool) or int(s) != s for s in second):
                raise TypeError
            shape = tuple(int(s) for s in second)
        except (TypeError, ValueError):
            raise SnsimError(f"{spec} returned an input shape {second!r} that is not a "
                             "sequence of integers (or an example tensor)") from None
        if not shape or any(s < 1 for s in shape):
            raise SnsimError(f"{spec} returned input shape {list(shape)}: use positive "
                             "integers, e.g. (3, 224, 224)")
    shape = input_shape or shape
    if not shape:
        raise SnsimError(f"{spec} does not give an input shape; pass --input-shape, e.g. 3,224,224")
    dtype = INPUT_DTYPES[input_dtype or "float32"]
    vocab = 0
    if not dtype.is_floating_point:
        sizes = [m.num_embeddings for m in made.modules() if isinstance(m, nn.Embedding)]
        if not sizes:
            raise SnsimError(f"--input-dtype {input_dtype} for {spec}: the model has no "
                             "nn.Embedding to bound the ids; return (model, example) instead")
        vocab = min(sizes)
    return ModelSpec(spec, made, shape, dtype, vocab)


def _with_example(spec, model, example, input_shape, input_dtype) -> ModelSpec:
    if example.dim() < 1 or example.shape[0] < 1:
        raise SnsimError(f"{spec} returned an example of shape {list(example.shape)}: its first "
                         "dimension must be the batch")
    shape = tuple(example.shape[1:])
    if input_shape is not None and tuple(input_shape) != shape:
        raise SnsimError(f"--input-shape {','.join(map(str, input_shape))} disagrees with the "
                         f"example {spec} returns (per sample {','.join(map(str, shape))})")
    name = str(example.dtype).replace("torch.", "")
    if input_dtype is not None and input_dtype != name:
        raise SnsimError(f"--input-dtype {input_dtype} disagrees with the example {spec} "
                         f"returns ({name})")
    return ModelSpec(spec, model, shape, example.dtype, 0, example.detach())


def resolve(spec: str, input_shape: tuple[int, ...] | None, device: torch.device,
            input_dtype: str | None = None) -> ModelSpec:
    """Build the model named by ``spec`` on ``device``."""
    if input_dtype is not None and input_dtype not in INPUT_DTYPES:
        raise SnsimError(f"unknown --input-dtype {input_dtype!r}; use one of "
                         f"{', '.join(INPUT_DTYPES)}")
    if ":" in spec and "=" not in spec.partition(":")[2]:
        return _import_model(spec, input_shape, device, input_dtype)
    if input_dtype is not None:
        raise SnsimError(f"--input-dtype is for models given as package.module:function; "
                         f"zoo model {spec} has its own input")
    entry, params = zoo.lookup(spec)
    shape = tuple(input_shape) if input_shape else entry.input_shape
    if len(shape) != len(entry.input_shape):
        raise SnsimError(f"model {entry.name} takes an input shape of {len(entry.input_shape)} "
                         f"numbers like {','.join(map(str, entry.input_shape))}, got "
                         f"{','.join(map(str, shape))}")
    with device:
        model = entry.build(shape, **params)
    dtype = torch.int64 if entry.input_dtype == "int64" else torch.float32
    vocab = {**entry.params, **params}.get("vocab", 0)
    return ModelSpec(spec, model, shape, dtype, vocab)


def batch_size(spec: ModelSpec, batch: int | None) -> int:
    """The batch to profile: ``--batch``, or the example's (refused if they disagree)."""
    if spec.example is not None:
        n = int(spec.example.shape[0])
        if batch is not None and batch != n:
            raise SnsimError(f"--batch {batch} disagrees with the example {spec.name} returns "
                             f"(batch {n})")
        return n
    if batch is None:
        raise SnsimError(f"{spec.name} gives no example batch; pass --batch")
    return batch


def example_input(spec: ModelSpec, batch: int, device: torch.device) -> torch.Tensor:
    shape = (batch, *spec.input_shape)
    if spec.example is not None:
        if device.type == "meta":
            return torch.empty(shape, dtype=spec.input_dtype, device=device)
        return spec.example.to(device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    if device.type == "meta":
        return torch.empty(shape, dtype=spec.input_dtype, device=device)
    if spec.input_dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=spec.input_dtype).to(device)
    return torch.randint(0, max(spec.vocab, 1), shape, generator=gen).to(device)


class _Bar:
    """tqdm progress (stderr) over whatever total the caller gives."""

    def __init__(self, enabled: bool):
        self.enabled, self.bar = enabled, None

    def phase(self, desc: str, total: int) -> None:
        self.close()
        if self.enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="layer", mininterval=0.5, leave=False)

    def step(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _device(device: str | None, preset: str | None) -> torch.device:
    if preset is not None:
        if device not in (None, "meta"):
            raise SnsimError(f"--device-model {preset} models a device; it cannot be combined "
                             f"with --device {device} (measured mode)")
        return torch.device("meta")
    device = device or "cpu"
    if device not in ("cpu", "cuda"):
        raise SnsimError(f"unknown --device {device!r}; use cpu or cuda "
                         "(or --device-model PRESET for a modeled trace)")
    if device == "cuda" and not torch.cuda.is_available():
        raise SnsimError("--device cuda requested but torch.cuda.is_available() is False "
                         "(no GPU, or a CPU-only torch build); use --device cpu or "
                         "--device-model PRESET")
    return torch.device(device)


def profile(spec: str, batch: int | None, input_shape: tuple[int, ...] | None = None,
            device: str | None = None, device_model: str | None = None, repeats: int = 10,
            warmup: int = 3, progress: bool = False,
            input_dtype: str | None = None, training=None) -> dict[str, Any]:
    """Profile model ``spec`` and return a validated ``snsim.trace/1`` document.

    ``batch`` may be None when the model function returns an example batch.
    ``training`` (a :class:`snsim.training.Training`) adds the trace's training
    record, its optimizer step measured (or, modeled, counted) on the model.
    """
    if batch is not None and batch < 1:
        raise SnsimError(f"--batch must be at least 1, got {batch}")
    if repeats < 1 or warmup < 0:
        raise SnsimError(f"--repeats must be >= 1 and --warmup >= 0, got {repeats}, {warmup}")
    preset = devices.get(device_model) if device_model is not None else None
    dev = _device(device, device_model)
    threads = torch.get_num_threads()
    if dev.type == "cpu":
        torch.set_num_threads(1)
    bar = _Bar(progress)
    try:
        ms = resolve(spec, input_shape, dev, input_dtype)
        batch = batch_size(ms, batch)
        ms.model.train()
        example = example_input(ms, batch, dev)

        def on_node(total):
            if total is not None:
                bar.phase("capture", total)
            else:
                bar.step()
        amp = "off" if training is None else training.amp
        if preset is not None:
            from snsim.profile import modeled

            captured, times = modeled.profile_layers(ms, example, amp, preset, on_node, bar)
            source, dev_block = modeled.source(preset, amp), modeled.device_block(preset)
        else:
            with autocast(amp, dev):   # activations in the dtypes autocast really makes
                captured = cap.capture(ms.model, example, on_node)
            from snsim.profile import measure
            clock = measure.Clock(dev)
            bar.phase("time", (warmup + repeats) * (len(captured.layers) - 1))
            step_fn = measure.training_step(ms.model, example, captured.layers[-1].op.fn)
            with _cudnn_heuristic(dev), autocast(amp, dev):
                times, step = measure.time_layers([la.op for la in captured.layers], clock,
                                                  warmup, repeats, step_fn, bar.step)
            bar.close()
            for layer, t in zip(captured.layers, times):
                _add_workspace(layer, t, dev, clock, warmup, repeats, measure)
            link = measure.link_bandwidth(dev)
            source, dev_block = _measured_source(dev, step, link, times), _measured_device(dev, link)
    finally:
        bar.close()
        torch.set_num_threads(threads)
    source.update(torch=torch.__version__.split("+")[0], torch_build=torch.__version__,
                  repeats=0 if preset else repeats, warmup=0 if preset else warmup,
                  created=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                  generator=f"snsim {__version__} profile", model_spec=spec,
                  fx_nodes=len(captured.graph_module.graph.nodes),
                  notes="views fold into their producer; in-place ops are marked inplace_of "
                        "(inplace_alias: writes into that input's storage); the loss is cross "
                        "entropy vs random integer targets (see snsim/torchgraph/capture.py "
                        "notes [1]-[10])")
    doc = {"schema": SCHEMA, "model": ms.name, "batch": batch,
           "dtype": "float32", "input_shape": list(ms.input_shape), "source": source,
           "device": dev_block,
           "layers": [_layer_doc(i, layer, t) for i, (layer, t) in
                      enumerate(zip(captured.layers, times))]}
    if captured.constant_bytes:   # buffers and constants: static (capture note [12])
        doc["constant_bytes"] = captured.constant_bytes
    if ms.input_dtype != torch.float32:
        doc["input_dtype"] = str(ms.input_dtype).replace("torch.", "")
    if preset is None:
        # Measured mode: memory each step allocates and frees itself (oneDNN weight
        # reorders, cuDNN workspaces, gradients materialized before they are added)
        # becomes the step's workspace, and each step's time is the time snsim's
        # executor takes for it: both measured by running the real executor.
        from snsim.profile import executor_measures

        del captured
        if training is not None and (training.set_to_none or amp != "off"):
            # the executor measures each step's transients with the gradients born in
            # backward and under autocast, as the trace will say (the optimizer step
            # is measured below)
            doc["training"] = {"optimizer": "none", "grads": training.grads, "amp": amp}
        if dev.type == "cpu":
            torch.set_num_threads(1)
        try:
            found, steps = executor_measures.measure(doc, ms.model, example, dev, warmup,
                                                     repeats, progress=progress)
        finally:
            torch.set_num_threads(threads)
        doc = executor_measures.with_measurements(doc, found, steps, dev, warmup, repeats)
    if training is not None:
        from snsim.profile.optimstep import training_record

        if dev.type == "cpu":
            torch.set_num_threads(1)
        try:
            doc["training"] = training_record(ms.model, dev, training, warmup, repeats)
        finally:
            torch.set_num_threads(threads)
    _validate(doc, f"<profile of {spec}>")
    return doc


# The text of the last document :func:`profile` validated: :func:`write` of the
# same document (same text) does not validate it a second time.
_validated_text: str | None = None


def _validate(doc: dict[str, Any], label: str) -> str:
    global _validated_text
    from_dict(doc, label)
    _validated_text = dumps(doc)
    return _validated_text


@contextlib.contextmanager
def _cudnn_heuristic(dev: torch.device):
    """Time passes with cuDNN's heuristic algorithms (the first workspace entry)."""
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = saved


def _add_workspace(layer, t, dev, clock, warmup, repeats, measure) -> None:
    """Convolution workspace entries; the first carries the layer's own times (DESIGN 2)."""
    if layer.kind != "conv" or layer.op is None:
        return
    if dev.type != "cuda":
        t["workspace"] = [{"algo": "cpu-default", "bytes": 0, "fwd_ms": t["fwd_ms"],
                           "bwd_ms": t["bwd_ms"]}]
        return
    entries, first = measure.conv_workspaces(layer.op, clock, warmup, repeats)
    # Candidates are timed alone; scale them by in-pass / alone of the first (the
    # algorithm the passes ran), so that entry 0 equals the layer and ratios hold.
    for key in ("fwd_ms", "bwd_ms"):
        ratio = t[key] / first[key] if first[key] > 0 else 1.0
        for e in entries:
            e[key] = e[key] * ratio
    t["workspace"] = entries


def _r(x: float) -> float:
    return round(float(x), 6)


def _layer_doc(i: int, layer: cap.CapturedLayer, t: dict[str, Any]) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": i, "name": layer.name, "kind": layer.kind, "inputs": list(layer.inputs),
        "output_bytes": layer.output_bytes, "param_bytes": layer.param_bytes,
        "fwd_ms": _r(t["fwd_ms"]), "bwd_ms": _r(t["bwd_ms"]), "bwd_reads": list(layer.bwd_reads)}
    if layer.saved_extra_bytes:
        d["saved_extra_bytes"] = layer.saved_extra_bytes
    if layer.grad_bytes is not None and layer.grad_bytes < layer.output_bytes:
        d["grad_bytes"] = layer.grad_bytes
    if layer.grad_shares:
        d["grad_shares"] = list(layer.grad_shares)
    if layer.param_shares:
        d["param_shares"] = [list(x) for x in layer.param_shares]
    if layer.grad_pieces:
        d["grad_pieces"] = [list(x) for x in layer.grad_pieces]
    if layer.grad_whole:
        d["grad_whole"] = list(layer.grad_whole)
    if layer.released_after is not None:
        d["released_after"] = layer.released_after
    for key in ("fwd_ms_p10", "fwd_ms_p90", "bwd_ms_p10", "bwd_ms_p90"):
        if key in t:
            d[key] = _r(t[key])
    for key in ("fwd_flops", "bwd_flops"):
        if key in t:
            d[key] = int(t[key])
    for key in ("fwd_kernels", "bwd_kernels"):
        if key in t:
            d[key] = [[int(k[0]), int(k[1]), *k[2:]] for k in t[key]]
    if "workspace" in t:
        d["workspace"] = [{k: (_r(v) if k.endswith("_ms") else v) for k, v in w.items()}
                          for w in t["workspace"]]
    d["op"] = layer.target
    d["shape"] = list(layer.shape)
    if layer.dtype != "float32":
        d["out_dtype"] = layer.dtype
    if layer.inplace_of is not None:
        d["inplace"] = True
        d["inplace_of"] = layer.inplace_of
        if layer.inplace_alias:
            d["inplace_alias"] = True
    return d


def cpu_name() -> str:
    """The processor's model name (``/proc/cpuinfo``), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _measured_source(dev, step, link, times) -> dict[str, Any]:
    total = sum(t["fwd_ms"] + t["bwd_ms"] for t in times)
    src = {"kind": "measured", "device": dev.type,
           "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_name(),
           "threads": 1 if dev.type == "cpu" else None,
           "clock": "CUDA events" if dev.type == "cuda" else "time.perf_counter_ns",
           "timing": "passes over the network: each layer once in execution order on leaf "
                     "copies of its recorded inputs, then each backward in reverse "
                     "(torch.autograd.grad wrt inputs and parameters, random grad_output); "
                     "fwd_ms/bwd_ms are medians over the repeats, *_p10/_p90 the spread; a "
                     "plain training step runs after each pass (step_ms)",
           **{k: round(v, 6) for k, v in step.items()},
           "layers_total_ms": round(total, 6),
           "link": {k: v for k, v in link.items()},
           "workspace": ("cuda: entries 'cudnn-heuristic' (benchmark off) and 'cudnn-benchmark' "
                         "(cudnnFind), workspace = allocator peak during the call beyond what it "
                         "keeps; candidates timed alone, scaled by the first's in-pass/alone "
                         "ratio" if dev.type == "cuda" else
                         "cpu: one 'cpu-default' entry (0 bytes) per convolution; CPU kernels "
                         "expose no algorithm choices")}
    return {k: v for k, v in src.items() if v is not None}


def _measured_device(dev, link) -> dict[str, Any]:
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        name, mem = props.name, int(props.total_memory)
    else:
        name = f"{cpu_name()} (host memory; link = memcpy)"
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"name": name, "memory_bytes": int(mem), "h2d_bytes_per_s": float(link["h2d_bytes_per_s"]),
            "d2h_bytes_per_s": float(link["d2h_bytes_per_s"])}


def dumps(doc: dict[str, Any]) -> str:
    """Compact JSON: top-level fields, then one layer per line."""
    head = {k: v for k, v in doc.items() if k != "layers"}
    parts = [json.dumps(k) + ": " + json.dumps(v) for k, v in head.items()]
    layers = ",\n  ".join(json.dumps(layer, separators=(",", ":")) for layer in doc["layers"])
    return "{" + ",\n ".join(parts) + ',\n "layers": [\n  ' + layers + "\n ]\n}\n"


def write(doc: dict[str, Any], path: str | os.PathLike) -> None:
    """Validate ``doc`` and write it whole (temporary file + rename).

    A document that :func:`profile` has just validated, unchanged since (the
    same JSON text), is not validated again."""
    text = dumps(doc)
    if text != _validated_text:
        from_dict(doc, str(path))
    write_atomic(path, text)
