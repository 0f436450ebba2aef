"""Finding this host's GPUs: NVML where there is a driver, simulated devices from a spec otherwise."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpupool.core import Device

DEFAULT_FAKE = "fake:2xH100-80GB"
_FAKE_PART = re.compile(r"^(\d{1,3})x([A-Za-z0-9][A-Za-z0-9_.-]{0,62})-(\d{1,4})GB$")


class GpuSpecError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Discovered:
    devices: tuple[Device, ...]
    simulated: bool
    uuids: tuple[str, ...]
    minors: tuple[int, ...] = ()
    """Each device's /dev/nvidiaN number, which need not be its NVML index; empty for simulated devices."""

    def device_node(self, index: int) -> str:
        return f"/dev/nvidia{self.minors[index] if index < len(self.minors) else index}"


def parse_fake(spec: str) -> tuple[Device, ...]:
    """'fake:2xH100-80GB,1xL4-24GB' → devices 0..2. Memory is in GB as vendors quote it (1 GB = 1024 MiB)."""
    if not spec.startswith("fake:"):
        raise GpuSpecError(f"{spec!r} is not a fake GPU spec; expected fake:<count>x<model>-<memory GB>[,...]")
    devices: list[Device] = []
    for part in spec.removeprefix("fake:").split(","):
        m = _FAKE_PART.match(part.strip())
        if not m:
            raise GpuSpecError(f"{part!r}: expected <count>x<model>-<memory GB>, for example 2xH100-80GB")
        count, model, gb = int(m.group(1)), m.group(2), int(m.group(3))
        if count < 1 or gb < 1:
            raise GpuSpecError(f"{part!r}: count and memory must be at least 1")
        base = len(devices)
        devices.extend(Device(base + i, model, gb * 1024) for i in range(count))
    if len(devices) > 256:
        raise GpuSpecError("at most 256 simulated GPUs on one host")
    return tuple(devices)


def _nvml() -> tuple[tuple[Device, ...], tuple[str, ...], tuple[int, ...]] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, no device: NVML reports it with its own error classes
        return None
    try:
        devices: list[Device] = []
        uuids: list[str] = []
        minors: list[int] = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            uuids.append(uuid.decode() if isinstance(uuid, bytes) else uuid)
            devices.append(Device(i, name.removeprefix("NVIDIA ").replace(" ", "-"), int(mem)))
            minors.append(int(pynvml.nvmlDeviceGetMinorNumber(h)))
        return tuple(devices), tuple(uuids), tuple(minors)
    finally:
        pynvml.nvmlShutdown()


def discover(spec: str) -> Discovered:
    """'auto': NVML if it finds GPUs, else the default simulated set; 'nvml': NVML or an error; 'fake:...'."""
    if spec.startswith("fake:"):
        devs = parse_fake(spec)
        return Discovered(devs, True, tuple(f"FAKE-{d.index}" for d in devs))
    if spec not in ("auto", "nvml"):
        raise GpuSpecError(f"--gpus {spec!r}: expected auto, nvml or fake:<count>x<model>-<memory GB>")
    found = _nvml()
    if found and found[0]:
        return Discovered(found[0], False, found[1], found[2])
    if spec == "nvml":
        raise GpuSpecError("--gpus nvml: NVML found no GPU on this host")
    devs = parse_fake(DEFAULT_FAKE)
    return Discovered(devs, True, tuple(f"FAKE-{d.index}" for d in devs))
