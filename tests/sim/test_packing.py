import json
import random
import re
from pathlib import Path

from typer.testing import CliRunner

from gpupool.cli.main import app
from gpupool.core import MILLI
from gpupool.sim.packing import arrivals, run_seed
from gpupool.sim.traces import load_nodes, load_pods


def test_arrivals_are_the_shuffled_trace_then_samples_up_to_the_target(alibaba: Path) -> None:
    pods = load_pods(alibaba / "openb_pod_list_default.csv")
    capacity = 6212 * MILLI
    sequence = arrivals(pods, capacity, 1.3, random.Random(42))
    head = sequence[: len(pods)]
    assert sorted(head, key=lambda p: p.name) == sorted(pods, key=lambda p: p.name) and head != list(pods)
    total = sum(p.gpu_request_milli for p in sequence)
    assert 1.3 * capacity - 8 * MILLI < total <= 1.3 * capacity + 8 * MILLI
    assert sequence == arrivals(pods, capacity, 1.3, random.Random(42))


def test_a_seed_fills_the_cluster_and_never_overcommits(small_trace: tuple[Path, Path]) -> None:
    nodes, pods = load_nodes(small_trace[0]), load_pods(small_trace[1])
    points = run_seed(nodes, pods, "gpupool", 42)
    assert [p.arrived_pct for p in points] == list(range(131))
    allocated = [p.allocated_milli for p in points]
    assert allocated == sorted(allocated)  # pods never finish
    assert all(0 <= p.allocated_milli <= p.total_milli for p in points)
    assert points[50].unallocated_gpu_pct < 55  # placing half the capacity leaves about half free
    assert points[130].unallocated_gpu_pct < 20
    assert points[130].failed > 0
    assert all(0 <= p.frag_rate_pct <= 100 for p in points)


def test_same_seed_same_result_and_seeds_differ(small_trace: tuple[Path, Path]) -> None:
    nodes, pods = load_nodes(small_trace[0]), load_pods(small_trace[1])
    a = run_seed(nodes, pods, "fgd", 42)
    assert a == run_seed(nodes, pods, "fgd", 42)
    assert a != run_seed(nodes, pods, "fgd", 43)


def test_cli_writes_summary_csv_and_plot(tmp_path: Path, small_trace: tuple[Path, Path]) -> None:
    nodes, pods = small_trace
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "packing",
            "--nodes",
            str(nodes),
            "--pods",
            str(pods),
            "--policy",
            "bestfit",
            "--seeds",
            "42-43",
            "--jobs",
            "1",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy"] == "bestfit" and summary["seeds"] == [42, 43]
    assert [p["arrived_pct"] for p in summary["points"]] == list(range(131))
    keys = {"arrived_pct", "unallocated_gpu_pct", "unallocated_gpu_pct_sd", "frag_rate_pct"}
    assert set(summary["points"][100]) == keys
    assert (out / "seed-42.csv").read_text().startswith("arrived_pct,")
    assert (out / "unallocated.png").read_bytes()[:4] == b"\x89PNG"
    # Not a terminal: the progress is plain lines (rich's bar would show nothing until the end), one per tenth.
    said = [line for line in result.stderr.splitlines() if line.startswith("packing ")]
    assert [re.sub(r", \d+m\d\ds$", "", line) for line in said] == [
        f"packing {pods.stem}: 1/2 (50%)", f"packing {pods.stem}: 2/2 (100%)"
    ]


def test_cli_all_policies_adds_a_comparison(tmp_path: Path, small_trace: tuple[Path, Path]) -> None:
    nodes, pods = small_trace
    out = tmp_path / "all"
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "packing",
            "--nodes",
            str(nodes),
            "--pods",
            str(pods),
            "--policy",
            "all",
            "--seeds",
            "42",
            "--jobs",
            "2",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    table = (out / "comparison.md").read_text()
    for policy in ("random", "dotprod", "clustering", "packing", "bestfit", "fgd", "gpupool"):
        assert f"| {policy} |" in table
        assert (out / policy / "summary.json").exists()
    assert (out / "comparison.png").exists()


def test_cli_refuses_bad_input_clearly(tmp_path: Path, small_trace: tuple[Path, Path]) -> None:
    nodes, pods = small_trace
    runner = CliRunner()
    for args, message in [
        (["--policy", "tetris"], "unknown policy"),
        (["--policy", "fgd", "--seeds", "51-42"], "seeds must look like"),
        (["--policy", "fgd", "--tune", "9"], "--tune"),
    ]:
        result = runner.invoke(
            app, ["simulate", "packing", "--nodes", str(nodes), "--pods", str(pods), "--out", str(tmp_path), *args]
        )
        assert result.exit_code == 2 and message in result.output, result.output
        assert "Traceback" not in result.output
    missing = runner.invoke(
        app, ["simulate", "packing", "--nodes", "nope.csv", "--pods", str(pods), "--policy", "fgd", "--out", "x"]
    )
    assert missing.exit_code == 2 and "No such file" in missing.output
