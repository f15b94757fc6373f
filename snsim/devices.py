"""Every device preset snsim knows, in one place (``--device-model``).

The profiler's modeled mode prices kernels on them; synthetic traces
(:mod:`snsim.synth`) take their memory and links from them.

Each preset is one public datasheet's figures.  ``fp32_flops`` is the peak
non-tensor FP32 rate (boost clock where the sheet gives one), ``tensor_flops``
the dense FP16 rate (tensor cores where the chip has them, no sparsity; the
P100's packed half2 rate; equal to FP32 where FP16 has no faster path),
``bf16_flops`` the dense BF16 rate (tensor cores from Ampere on; chips before
Ampere have no BF16 arithmetic, PyTorch computes BF16 matmuls there at FP32
speed or slower, so it is the FP32 rate), ``mem_Bps`` the device memory
bandwidth.  Mixed-precision modeled traces price a kernel whose floating
inputs are FP16/BF16 at that rate (:func:`kernel_seconds`).  Host links:
``link`` names the bus and its theoretical per-direction rate; ``h2d_Bps`` /
``d2h_Bps`` are the *effective* pinned-copy rates used by the simulator, taken
as 80% of the theoretical per-direction rate (what CUDA's bandwidthTest
typically reaches: about 12 GB/s on PCIe 3.0 x16).  Memory is what the sheet
advertises (GB cards as 2**30 multiples where NVIDIA sizes them in GiB).

No torch import here: listing presets must work without torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from snsim.errors import SnsimError

# Effective fraction of a PCIe link's theoretical per-direction rate (note above).
LINK_EFFICIENCY = 0.8
_PCIE3, _PCIE4, _PCIE5 = 15.75e9, 31.5e9, 63.0e9


@dataclass(frozen=True, slots=True)
class DevicePreset:
    key: str
    name: str
    memory_bytes: int
    fp32_flops: float
    tensor_flops: float
    mem_Bps: float
    link: str
    link_Bps: float        # theoretical, per direction
    source: str
    bf16_flops: float = 0.0   # 0: no BF16 arithmetic, the FP32 rate applies

    def peak_flops(self, precision: str | None = None) -> float:
        """Peak FLOP/s of a kernel computing in ``precision`` (None/``fp32``,
        ``fp16``, ``bf16``)."""
        if precision == "fp16":
            return self.tensor_flops
        if precision == "bf16":
            return self.bf16_flops or self.fp32_flops
        return self.fp32_flops

    @property
    def h2d_Bps(self) -> float:
        return LINK_EFFICIENCY * self.link_Bps

    @property
    def d2h_Bps(self) -> float:
        return LINK_EFFICIENCY * self.link_Bps


PRESETS: dict[str, DevicePreset] = {p.key: p for p in (
    DevicePreset("k40c", "NVIDIA Tesla K40c", 12 * 2**30, 5.04e12, 5.04e12, 288e9,
                 "PCIe 3.0 x16", _PCIE3,
                 "NVIDIA Tesla K40 GPU Accelerator board specification BD-06902-001 / "
                 "K40 datasheet: 12 GB GDDR5, 288 GB/s, 4.29 TFLOP/s FP32 base, "
                 "5.04 at 875 MHz boost; Kepler has no FP16/BF16 arithmetic (FP32 rate)"),
    DevicePreset("titanx", "NVIDIA GeForce GTX TITAN X (Maxwell)", 12 * 2**30, 6.6e12, 6.6e12,
                 336.5e9, "PCIe 3.0 x16", _PCIE3,
                 "NVIDIA GeForce GTX TITAN X specifications (geforce.com, 2015): "
                 "12 GB GDDR5, 336.5 GB/s, 3072 CUDA cores at 1075 MHz boost = 6.6 TFLOP/s; "
                 "Maxwell has no fast FP16/BF16 arithmetic (FP32 rate)"),
    DevicePreset("p100", "NVIDIA Tesla P100 PCIe 16 GB", 16 * 2**30, 9.3e12, 18.7e12, 732e9,
                 "PCIe 3.0 x16", _PCIE3,
                 "NVIDIA Tesla P100 PCIe datasheet (2016): 16 GB HBM2, 732 GB/s, "
                 "9.3 TFLOP/s FP32, 18.7 TFLOP/s FP16; no BF16 (FP32 rate)"),
    DevicePreset("v100", "NVIDIA Tesla V100 SXM2 32 GB", 32 * 2**30, 15.7e12, 125e12, 900e9,
                 "PCIe 3.0 x16 (host)", _PCIE3,
                 "NVIDIA V100 Tensor Core GPU datasheet (2020): 32 GB HBM2, 900 GB/s, "
                 "15.7 TFLOP/s FP32, 125 TFLOP/s tensor (SXM2, FP16); Volta's tensor cores "
                 "have no BF16 (FP32 rate)"),
    DevicePreset("a100", "NVIDIA A100 SXM4 80 GB", 80 * 2**30, 19.5e12, 312e12, 2039e9,
                 "PCIe 4.0 x16", _PCIE4,
                 "NVIDIA A100 Tensor Core GPU datasheet (2021): 80 GB HBM2e, 2,039 GB/s, "
                 "19.5 TFLOP/s FP32, 312 TFLOP/s FP16 and BF16 tensor (dense; 624 with "
                 "sparsity), PCIe Gen4 64 GB/s", bf16_flops=312e12),
    DevicePreset("h100", "NVIDIA H100 SXM5 80 GB", 80 * 2**30, 67e12, 989e12, 3.35e12,
                 "PCIe 5.0 x16", _PCIE5,
                 "NVIDIA H100 Tensor Core GPU datasheet (2023): 80 GB HBM3, 3.35 TB/s, "
                 "67 TFLOP/s FP32, 989 TFLOP/s FP16 and BF16 tensor (dense; the sheet's "
                 "1,979 is with sparsity), PCIe Gen5 128 GB/s", bf16_flops=989e12),
    DevicePreset("h200", "NVIDIA H200 SXM 141 GB", 141 * 10**9, 67e12, 989e12, 4.8e12,
                 "PCIe 5.0 x16", _PCIE5,
                 "NVIDIA H200 Tensor Core GPU datasheet (2024): 141 GB HBM3e, 4.8 TB/s, "
                 "67 TFLOP/s FP32, 989 TFLOP/s FP16 and BF16 tensor (dense; the sheet's "
                 "1,979 is with sparsity), PCIe Gen5 128 GB/s", bf16_flops=989e12),
)}


# The roofline of modeled traces (snsim.profile.modeled documents it): each
# kernel costs max(flops / (EFF_COMPUTE x peak), bytes / (EFF_MEMORY x memory
# bandwidth)) + T_LAUNCH_S, the peak of the kernel's precision (FP32, or the
# FP16/BF16 rate for a mixed-precision kernel, DevicePreset.peak_flops); a
# layer's step is the sum over its kernels, at least one launch.  Assumptions,
# not measurements.
EFF_COMPUTE = 0.6
EFF_MEMORY = 0.8
T_LAUNCH_S = 5e-6


PRECISIONS = ("fp16", "bf16")   # a kernel record's optional third element


def kernel_seconds(flops: float, nbytes: int, preset: DevicePreset,
                   precision: str | None = None) -> float:
    """One kernel's roofline time on ``preset``, computing in ``precision``
    (None: FP32)."""
    return max(flops / (EFF_COMPUTE * preset.peak_flops(precision)),
               nbytes / (EFF_MEMORY * preset.mem_Bps)) + T_LAUNCH_S


def step_ms(kernels, preset: DevicePreset) -> float:
    """A step's modeled time in ms from its kernels' ``(flops, bytes[, precision])``,
    summed in order (a kernel without a precision computes in FP32)."""
    seconds = 0.0
    for k in kernels:
        seconds += kernel_seconds(k[0], k[1], preset, k[2] if len(k) > 2 else None)
    return max(seconds, T_LAUNCH_S) * 1e3


def get(key: str) -> DevicePreset:
    """The preset named ``key``; :class:`SnsimError` listing the choices otherwise."""
    try:
        return PRESETS[key.lower()]
    except KeyError:
        raise SnsimError(f"unknown device model {key!r}; choose one of "
                         f"{', '.join(PRESETS)} (see snsim profile --list-device-models)") \
            from None


def table() -> str:
    """The presets as a text table with their sources (``--list-device-models``)."""
    rows = [f"{'preset':8} {'memory':>9} {'FP32':>10} {'FP16':>10} {'BF16':>10} {'mem BW':>10} "
            f"{'host link (effective)':>28}"]
    for p in PRESETS.values():
        rows.append(f"{p.key:8} {p.memory_bytes / 2**30:7.1f}Gi {p.fp32_flops / 1e12:6.1f} TF/s "
                    f"{p.tensor_flops / 1e12:6.1f} TF/s {p.peak_flops('bf16') / 1e12:6.1f} TF/s "
                    f"{p.mem_Bps / 1e9:6.0f} GB/s "
                    f"{p.link:>16} {p.h2d_Bps / 1e9:5.1f} GB/s")
        rows.append(f"         {p.name}; source: {p.source}")
    return "\n".join(rows)
