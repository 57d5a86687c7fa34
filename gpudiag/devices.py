"""Peak compute and memory bandwidth of the devices gpudiag knows.

Traces carry the device *name* (``deviceProperties``) but never its peaks, so MFU and the
roofline need this table. Every figure is the dense (no structured sparsity) peak from the
vendor's datasheet cited beside it; boost clocks, SXM form factor unless the entry says
otherwise. The CPU has no datasheet peak worth trusting, so its entry is measured on the
machine (``gpudiag.collectors.cpu_peak``) and passed in as a ``DevicePeak`` like any other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpudiag.errors import BadInput

TERA = 1e12
GIGA = 1e9


@dataclass(frozen=True)
class DevicePeak:
    """Ceilings of one device. FLOP/s per dtype family, bytes/s of its main memory."""

    name: str
    # dtype family -> peak FLOP/s. Families: "fp32" (CUDA cores / vector), "tf32",
    # "bf16", "fp16", "fp8", "fp64" (measured on a CPU; the GPU tables leave it out, so fp64
    # work there is judged at the fp32 peak, as before it had a family). Missing family means
    # the device has no such unit.
    flops: dict[str, float]
    bandwidth: float  # bytes/s, main memory (HBM/GDDR/DRAM)
    source: str  # "table: <datasheet>", "user", or "measured: <how>"
    interconnect: float | None = None  # bytes/s per GPU, NVLink/xGMI, for bus bandwidth
    aliases: tuple[str, ...] = field(default=(), compare=False)

    def peak_for(self, dtype: str) -> tuple[float, str]:
        """Peak FLOP/s for a torch dtype name, and the family it was taken from.

        fp32 matmuls run on CUDA cores unless TF32 is enabled (off by default for matmul
        since PyTorch 1.12), so "float" maps to the fp32 peak, the conservative choice.
        """
        return self.family_peak(DTYPE_FAMILY.get(dtype.lower(), "fp32"))

    def family_peak(self, family: str) -> tuple[float, str]:
        """Peak FLOP/s of a dtype family ("bf16"), or the fp32 one where the device has none."""
        if family in self.flops:
            return self.flops[family], family
        return self.flops["fp32"], "fp32"

    def ridge(self, dtype: str = "float") -> float:
        """Arithmetic intensity (FLOP/byte) where the compute and bandwidth ceilings meet."""
        return self.peak_for(dtype)[0] / self.bandwidth


# torch's "Input type" strings (and dtype names in collectives) -> peak family.
DTYPE_FAMILY: dict[str, str] = {
    "float": "fp32",
    "float32": "fp32",
    "double": "fp64",
    "float64": "fp64",
    "tf32": "tf32",
    "c10::bfloat16": "bf16",
    "bfloat16": "bf16",
    "c10::half": "fp16",
    "half": "fp16",
    "float16": "fp16",
    "c10::float8_e4m3fn": "fp8",
    "c10::float8_e5m2": "fp8",
}

# Bytes per element for the dtype strings found in traces ("Input type", "dtype" args).
DTYPE_BYTES: dict[str, int] = {
    "float": 4,
    "float32": 4,
    "double": 8,
    "float64": 8,
    "c10::bfloat16": 2,
    "bfloat16": 2,
    "c10::half": 2,
    "half": 2,
    "float16": 2,
    "c10::float8_e4m3fn": 1,
    "c10::float8_e5m2": 1,
    "long int": 8,
    "long": 8,
    "int64": 8,
    "int": 4,
    "int32": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "byte": 1,
    "char": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
}


def _gpu(name: str, fp32: float, tf32: float | None, bf16: float | None, fp16: float | None,
         fp8: float | None, hbm_gbs: float, source: str, link_gbs: float | None = None,
         aliases: tuple[str, ...] = ()) -> DevicePeak:
    flops = {"fp32": fp32 * TERA}
    for fam, v in (("tf32", tf32), ("bf16", bf16), ("fp16", fp16), ("fp8", fp8)):
        if v is not None:
            flops[fam] = v * TERA
    return DevicePeak(name=name, flops=flops, bandwidth=hbm_gbs * GIGA, source=f"table: {source}",
                      interconnect=None if link_gbs is None else link_gbs * GIGA, aliases=aliases)


# Keys are canonical names accepted by --device; aliases are matched against trace names.
DEVICE_TABLE: dict[str, DevicePeak] = {
    # NVIDIA Tesla V100 datasheet (Jan 2018): SXM2 15.7 TF fp32, 125 TF tensor fp16, 900 GB/s,
    # NVLink 300 GB/s.
    "V100-SXM2": _gpu("V100-SXM2", 15.7, None, None, 125, None, 900, "NVIDIA Tesla V100 datasheet",
                      300, ("v100-sxm2", "v100 sxm2", "tesla v100-sxm2")),
    # Same datasheet, PCIe column: 14 TF fp32, 112 TF tensor, 900 GB/s.
    "V100-PCIE": _gpu("V100-PCIE", 14, None, None, 112, None, 900, "NVIDIA Tesla V100 datasheet",
                      None, ("v100-pcie", "tesla v100-pcie", "v100")),
    # NVIDIA A100 datasheet (2021): 19.5 TF fp32, 156 TF tf32, 312 TF bf16/fp16 dense;
    # 40GB SXM4 1,555 GB/s; NVLink 600 GB/s. A100-PG509-200 is a 40 GB SXM4 board.
    "A100-40GB": _gpu("A100-40GB", 19.5, 156, 312, 312, None, 1555, "NVIDIA A100 datasheet",
                      600, ("a100-sxm4-40gb", "a100-pcie-40gb", "a100-pg509-200", "a100 40gb")),
    # Same datasheet, 80GB SXM4: 2,039 GB/s.
    "A100-80GB": _gpu("A100-80GB", 19.5, 156, 312, 312, None, 2039, "NVIDIA A100 datasheet",
                      600, ("a100-sxm4-80gb", "a100 80gb", "a100-80gb")),
    # NVIDIA H100 datasheet: SXM 67 TF fp32, 494.7 TF tf32, 989.4 TF bf16/fp16, 1,978.9 TF fp8
    # (dense = half the sparse figures printed), 3.35 TB/s, NVLink 900 GB/s.
    "H100-SXM": _gpu("H100-SXM", 67, 494.7, 989.4, 989.4, 1978.9, 3350, "NVIDIA H100 datasheet",
                     900, ("h100 80gb hbm3", "h100-sxm", "h100 sxm")),
    # Same datasheet, PCIe: 51 TF fp32, 378 TF tf32, 756 TF bf16, 1,513 TF fp8, 2.0 TB/s.
    "H100-PCIE": _gpu("H100-PCIE", 51, 378, 756, 756, 1513, 2000, "NVIDIA H100 datasheet",
                      None, ("h100 pcie", "h100-pcie")),
    # NVIDIA H200 datasheet: same tensor cores as H100 SXM, 4.8 TB/s HBM3e, NVLink 900 GB/s.
    "H200": _gpu("H200", 67, 494.7, 989.4, 989.4, 1978.9, 4800, "NVIDIA H200 datasheet",
                 900, ("h200",)),
    # NVIDIA L4 datasheet: 30.3 TF fp32, 60 TF tf32, 121 TF bf16/fp16, 242.5 TF fp8 (dense),
    # 300 GB/s.
    "L4": _gpu("L4", 30.3, 60, 121, 121, 242.5, 300, "NVIDIA L4 datasheet", None, ("nvidia l4",)),
    # NVIDIA A10 datasheet: 31.2 TF fp32, 62.5 TF tf32, 125 TF bf16/fp16 dense, 600 GB/s.
    "A10": _gpu("A10", 31.2, 62.5, 125, 125, None, 600, "NVIDIA A10 datasheet", None,
                ("nvidia a10",)),
    # A10G (AWS G5) has no NVIDIA datasheet; AWS's G5 page gives the same 600 GB/s GDDR6 and
    # the GA102 at lower tensor clocks: 31.2 TF fp32, 70 TF bf16/fp16 dense is the figure
    # commonly derived from its 80 SMs at 1,710 MHz. Treat MFU on A10G as approximate.
    "A10G": _gpu("A10G", 31.2, 35, 70, 70, None, 600, "AWS EC2 G5 specs (derived, approximate)",
                 None, ("a10g",)),
    # AMD Instinct MI250 datasheet: 45.3 TF fp32 vector, 90.5 TF fp32 matrix, 362.1 TF
    # bf16/fp16, 3.2 TB/s HBM2e (both GCDs of the OAM module).
    "MI250": _gpu("MI250", 90.5, None, 362.1, 362.1, None, 3200, "AMD Instinct MI250 datasheet",
                  None, ("mi250", "amd radeon graphics")),
    # AMD Instinct MI250X datasheet: 95.7 TF fp32 matrix, 383 TF bf16/fp16, 3.2 TB/s.
    "MI250X": _gpu("MI250X", 95.7, None, 383, 383, None, 3200, "AMD Instinct MI250X datasheet",
                   None, ("mi250x",)),
}


def known_device_names() -> list[str]:
    return sorted(DEVICE_TABLE)


def lookup_device(name: str) -> DevicePeak:
    """Find a device by canonical name (``--device``) or by the name a trace records.

    Raises ``BadInput`` naming the known devices when nothing matches: an unknown device
    must never silently become some other device's peak.
    """
    found = match_device(name)
    if found is None:
        raise BadInput(
            f"unknown device {name!r}; known: {', '.join(known_device_names())} "
            "(or give --peak-tflops and --peak-gbps)"
        )
    return found


def match_device(name: str) -> DevicePeak | None:
    """Best table entry for a device name, or None. Longest alias wins (MI250X over MI250)."""
    key = name.strip().lower()
    for canonical, peak in DEVICE_TABLE.items():
        if key == canonical.lower():
            return peak
    normalized = re.sub(r"\s+", " ", key)
    best: tuple[int, DevicePeak] | None = None
    for peak in DEVICE_TABLE.values():
        for alias in peak.aliases:
            if alias in normalized and (best is None or len(alias) > best[0]):
                best = (len(alias), peak)
    return None if best is None else best[1]


def user_device(peak_tflops: float, peak_gbps: float, name: str = "user-specified") -> DevicePeak:
    """A device from ``--peak-tflops``/``--peak-gbps``; the one peak applies to every dtype."""
    if peak_tflops <= 0 or peak_gbps <= 0:
        raise BadInput("--peak-tflops and --peak-gbps must be positive")
    flops = {fam: peak_tflops * TERA for fam in ("fp32", "tf32", "bf16", "fp16", "fp8")}
    return DevicePeak(name=name, flops=flops, bandwidth=peak_gbps * GIGA, source="user")
