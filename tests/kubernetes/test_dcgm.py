"""dcgm-exporter's page read as gpupool reads it, without a cluster: the GPUs, who holds each, and the
members' samples they make."""

from __future__ import annotations

import pytest

from gpupool.backends.base import DeviceSample, MemberSample, Sample
from gpupool.backends.kubernetes.dcgm import GpuReading, PodIndex, parse, to_sample

PAGE = """\
# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="x"} 1410
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="x",container="main",namespace="team",pod="train-1"} 87
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA A100-SXM4-80GB",Hostname="x"} 0
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="x",container="main",namespace="team",pod="train-1"} 40960
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA A100-SXM4-80GB",Hostname="x"} 0
DCGM_FI_DEV_FB_USED{gpu="2",UUID="GPU-c",device="nvidia2",modelName="NVIDIA A100-SXM4-80GB",Hostname="x"} 3
"""  # noqa: E501 - the exporter's own lines


def test_a_page_gives_a_reading_per_gpu_with_utilisation_and_who_holds_it() -> None:
    model = "NVIDIA A100-SXM4-80GB"
    assert parse(PAGE, "n1") == [
        GpuReading(DeviceSample("n1", 0, "GPU-a", model, 87, 40960), frozenset({("team", "train-1")})),
        GpuReading(DeviceSample("n1", 1, "GPU-b", model, 0, 0), frozenset()),
    ]  # GPU 2 reports no utilisation: not a reading


def test_a_page_that_is_not_the_exposition_format_is_refused() -> None:
    with pytest.raises(ValueError):
        parse('DCGM_FI_DEV_GPU_UTIL{gpu="0" 87\n', "n1")


def test_readings_become_device_and_member_samples_named_as_gpupool_names_them() -> None:
    readings = [*parse(PAGE, "n1"), GpuReading(DeviceSample("n2", 3, "GPU-d", "NVIDIA A100-SXM4-80GB", 40, 900),
                                               frozenset({("gpupool-system", "reservation-n2-3")}))]  # fmt: skip
    index = PodIndex(
        members={("team", "train-1"): "7-0-0"},
        reservations={"reservation-n2-3": ("n2", 1)},
        sharers={("n2", 1): {"8-0-0": 500, "9-0-0": 250}},
        models={"n1": "A100-80GB"},
    )
    assert to_sample(readings, index, "gpupool-system") == Sample(
        {"7-0-0": MemberSample(87, 40960), "8-0-0": MemberSample(40, 600), "9-0-0": MemberSample(40, 300)},
        (
            DeviceSample("n1", 0, "GPU-a", "A100-80GB", 87, 40960),
            DeviceSample("n1", 1, "GPU-b", "A100-80GB", 0, 0),
            DeviceSample("n2", 3, "GPU-d", "A100-SXM4-80GB", 40, 900),  # a node gpupool has not listed: DCGM's name
        ),
        modelled=False,
    )
