from pathlib import Path

import pytest

from gpupool.core import MILLI
from gpupool.sim.traces import TraceError, load_nodes, load_pods


def test_the_gpu_node_list_is_the_papers_cluster(alibaba: Path) -> None:
    nodes = load_nodes(alibaba / "openb_node_list_gpu_node.csv")
    assert len(nodes) == 1213
    assert sum(len(n.devices) for n in nodes) == 6212
    assert {d.model for n in nodes for d in n.devices} == {"G2", "T4", "G3", "P100", "V100M32", "V100M16", "A10"}


def test_default_pod_list_shapes(alibaba: Path) -> None:
    pods = load_pods(alibaba / "openb_pod_list_default.csv")
    assert len(pods) == 8152
    assert sum(1 for p in pods if p.num_gpu == 0) == 1088
    assert sum(1 for p in pods if p.num_gpu == 1 and p.gpu_milli < MILLI) == 3078
    assert sum(p.gpu_request_milli for p in pods) == 6_086_800
    fractional = next(p for p in pods if 0 < p.gpu_milli < MILLI)
    assert fractional.request().gpu_milli == fractional.gpu_milli


def test_gpu_spec_constrains_the_models(tmp_path: Path) -> None:
    f = tmp_path / "spec.csv"
    f.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "p0,1000,1024,1,500,V100M16|V100M32,LS,Running,0,10,0\n"
    )
    assert load_pods(f)[0].gpu_spec == ("V100M16", "V100M32")


def test_the_five_column_layout_loads(tmp_path: Path) -> None:
    f = tmp_path / "multigpu.csv"
    f.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,8000,16384,2,1000\np1,4000,8192,1,500\n")
    pods = load_pods(f)
    assert [p.request().gpus for p in pods] == [2, 0] and pods[1].request().gpu_milli == 500


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("name,cpu\nx,1\n", "unexpected header"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,abc,1,0,0\n", "not an integer"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,2,500\n", "whole GPUs"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1,0\n", "1..1000"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,-1,1,0,0\n", "negative"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n", "no pods"),
    ],
)
def test_bad_pod_lists_are_refused_with_the_line(tmp_path: Path, body: str, message: str) -> None:
    f = tmp_path / "pods.csv"
    f.write_text(body)
    with pytest.raises(TraceError, match=message):
        load_pods(f)


def test_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="No such file"):
        load_nodes(tmp_path / "absent.csv")
