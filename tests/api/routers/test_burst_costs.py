"""Costs across the fleet: the usage report's on-premises and burst split, each department's burst budget line, and
a department's burst settings with its month's spending, over the real app and store, with the rented nodes' bills
and the minutes of usage written into the store as the hub's loop and meter write them; the server's clock stands
at a fixed instant (no loop runs), and the same app served to the real `gpupool` command line.

The scene, ten days into April 2026 (30 days): department A rents
- a: 1 GPU at $3.60/GPU-hour, held 1000 s two hours ago: $1.00;
- b: 2 GPUs at $1.80, asked an hour ago, ready and held: $3.60 so far, $3.60 an hour;
- c: 1 GPU at $3.60, asked half an hour before April, released half an hour into it: $1.80 of it in April;
- d: 1 GPU at $3.60, asked 15 minutes ago, being given back (billed until the provider confirms): $0.90, $3.60 an hour;
so A has spent $7.30 this month, which at that pace (10 days of 30) comes to $21.90, and pays $7.20 an hour now.
Its project P ran 30 minutes on an on-premises GPU ($2.00/GPU-hour: $1.00) and 30 minutes on b's 2 GPUs, half of
it busy ($1.80 at b's price). Over the report's two hours A rented a, b and d: 9100 GPU-seconds, $5.50, of which
P's work accounts for $1.80: $3.70 rented and unused. Department B has a budget, no bill, and its last ask was
refused for full pools."""

from __future__ import annotations

import csv
import io
import subprocess
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.store.tables import BurstNodeRow, QueueRow, UsageRow
from tests.api.inprocess import Api, on_socket
from tests.api.routers.factories import Factory, Person, client
from tests.e2e.conftest import GPUPOOL

NOW = datetime(2026, 4, 11, tzinfo=UTC).timestamp()
APRIL = datetime(2026, 4, 1, tzinfo=UTC).timestamp()
PERIOD = {"start": NOW - 7200, "end": NOW}


class Scene:
    def __init__(self, api: Api, make: Factory) -> None:
        self.api, self.make = api, make

    async def build(self) -> Scene:
        make = self.make
        self.a, self.b, self.c = await make.department(), await make.department(), await make.department()
        self.p, self.q = await make.project(self.a), await make.project(self.b)
        self.m, self.n = await make.user(self.p), await make.user(self.q)
        self.a_admin = await make.department_admin(self.a)
        await make.ok("PUT", f"/api/v1/departments/{self.a}/burst", {"monthly_budget": 100})
        await make.ok("PUT", f"/api/v1/departments/{self.b}/burst", {"monthly_budget": 50, "after_s": 600})
        job = await make.workload(self.p, gpus=2)
        on_prem, on_burst = int((NOW - 7200) // 60), int((NOW - 3600) // 60)
        with self.api.ctx.sessions() as s:
            s.add_all([
                _node("a", self.a, 1, 3_600_000, "released", NOW - 5000, NOW - 4000),
                _node("b", self.a, 2, 1_800_000, "ready", NOW - 3600, None),
                _node("c", self.a, 1, 3_600_000, "released", APRIL - 1800, APRIL + 1800),
                _node("d", self.a, 1, 3_600_000, "releasing", NOW - 900, None),
                _node("x", self.c, 8, 3_600_000, "released", APRIL - 7200, APRIL - 3600),  # March's: no line
            ])  # fmt: skip
            s.add_all(
                UsageRow(workload_id=job["id"], minute=on_prem + i, pool="default", milli_seconds=60_000,
                         busy_milli_seconds=0)
                for i in range(30)
            )  # fmt: skip
            s.add_all(
                UsageRow(workload_id=job["id"], minute=on_burst + i, pool="default", milli_seconds=120_000,
                         busy_milli_seconds=60_000, burst_price_micro=1_800_000)
                for i in range(30)
            )  # fmt: skip
            for name, refused in ((self.a, "over-budget"), (self.b, "pools-full")):
                row = s.query(QueueRow).filter_by(name=name).one()
                row.burst_refused, row.burst_refused_at = refused, NOW - 60
            s.commit()
        return self

    def line_a(self) -> dict[str, Any]:
        return {
            "department": self.a, "monthly_budget": 100.0, "spent": 7.3, "forecast": 21.9, "rate_per_hour": 7.2,
            "rented_gpu_hours": 2.527778, "rented_cost": 5.5, "unused_cost": 3.7, "refused": "over-budget",
        }  # fmt: skip

    def line_b(self) -> dict[str, Any]:
        return {
            "department": self.b, "monthly_budget": 50.0, "spent": 0.0, "forecast": 0.0, "rate_per_hour": 0.0,
            "rented_gpu_hours": 0.0, "rented_cost": 0.0, "unused_cost": 0.0, "refused": "pools-full",
        }  # fmt: skip


def _node(
    name: str, department: str, gpus: int, price: int, phase: str, asked: float, released: float | None
) -> BurstNodeRow:
    return BurstNodeRow(
        name=f"{department}-{name}", cluster="cloud", department=department, gpus=gpus, price_micro=price,
        phase=phase, asked_at=asked, released_at=released, for_workloads=[],
    )  # fmt: skip


@pytest.fixture
def served(fresh_api: Callable[..., Api]) -> Iterator[tuple[Api, str]]:
    """A server of its own ($2.00 per on-premises GPU-hour), its clock at NOW, served on a socket as well."""
    api = fresh_api(prices={"default": 2.0})
    api.ctx.controller.clock = lambda: NOW
    with on_socket(api.app) as url:
        yield api, url


async def _report(http: httpx.AsyncClient, who: Person, by: str) -> Any:
    r = await http.get("/api/v1/reports/usage", params={**PERIOD, "by": by}, headers=who.auth)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.anyio
async def test_the_report_splits_on_premises_and_burst_cost_and_shows_each_budget_to_whoever_sees_it(
    served: tuple[Api, str],
) -> None:
    async with client(served[0]) as http:
        scene = await Scene(served[0], Factory(served[0], http)).build()
        make = scene.make
        report = await _report(http, make.admin, "department")
        # 0.5 GPU-h on-premises at $2.00 and 1 GPU-h on b at $1.80, half of it busy.
        assert report["lines"] == [{
            "key": scene.a, "gpu_hours": 1.5, "busy_gpu_hours": 0.5, "idle_gpu_hours": 1.0, "cost": 2.8,
            "busy_cost": 0.9, "idle_cost": 1.9, "on_prem_cost": 1.0, "burst_cost": 1.8, "burst_gpu_hours": 1.0,
            "runs": 1,
        }]  # fmt: skip
        assert report["total"] == report["lines"][0] | {"key": "total"}
        # Departments by name: A and B have budgets; C's only bill is March's.
        lines = sorted([scene.line_a(), scene.line_b()], key=lambda b: b["department"])
        assert report["budgets"] == lines
        # A member of P sees A's line only, whole (its unused part counts all of A's projects); one of B's, B's.
        assert (await _report(http, scene.m, "project"))["budgets"] == [scene.line_a()]
        assert (await _report(http, scene.n, "project"))["budgets"] == [scene.line_b()]
        # A period from now on: nothing rented in it yet, this month's figures as they are.
        r = await http.get("/api/v1/reports/usage", params={"start": NOW, "end": NOW + 3600}, headers=scene.m.auth)
        zero = {"rented_gpu_hours": 0.0, "rented_cost": 0.0, "unused_cost": 0.0}
        assert r.json()["budgets"] == [scene.line_a() | zero]


@pytest.mark.anyio
async def test_a_departments_burst_settings_carry_its_months_spending_and_only_admins_set_them(
    served: tuple[Api, str],
) -> None:
    api = served[0]
    async with client(api) as http:
        scene = await Scene(api, Factory(api, http)).build()
        path = f"/api/v1/departments/{scene.a}/burst"
        month = {"spent": 7.3, "forecast": 21.9, "rate_per_hour": 7.2, "nodes": 1, "refused": "over-budget"}
        a = {"department": scene.a, "after_s": 1800.0, "monthly_budget": 100.0, "paced": True,
             "stop_at_budget": True, **month}  # fmt: skip
        r = await http.get(path, headers=scene.m.auth)
        assert (r.status_code, r.json()) == (200, a)
        r = await http.get(path, headers=scene.n.auth)
        assert (r.status_code, r.json()) == (404, {"detail": f"no department named {scene.a!r}"})
        body = {"monthly_budget": 100, "after_s": 1800, "paced": False, "stop_at_budget": False}
        for who in (scene.m, scene.a_admin):
            r = await http.put(path, json=body, headers=who.auth)
            assert (r.status_code, r.json()) == (403, {"detail": "only an admin may do this"})
        r = await http.put(path, json=body, headers=scene.make.admin.auth)
        assert (r.status_code, r.json()) == (200, a | {"paced": False, "stop_at_budget": False})
        with api.ctx.sessions() as s:
            row = s.query(QueueRow).filter_by(name=scene.a).one()
            assert (row.burst_paced, row.burst_stop_at_budget) == (False, False)
        # Off: no budget and no threshold; pacing and the stop are kept for when it bursts again.
        r = await http.put(path, json={"paced": False, "stop_at_budget": False}, headers=scene.make.admin.auth)
        assert r.json() == a | {"after_s": None, "monthly_budget": None, "paced": False, "stop_at_budget": False}


def _cli(url: str, who: Person, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"GPUPOOL_URL": url, "GPUPOOL_TOKEN": who.token, "PATH": "/usr/bin:/bin", "HOME": str(Path.home()),
           "COLUMNS": "300"}  # fmt: skip
    return subprocess.run([GPUPOOL, *args], env=env, capture_output=True, text=True, timeout=60)


def _rows(table: str) -> list[list[str]]:
    """A Rich table's body rows, cell by cell."""
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in table.splitlines() if line.startswith("│")]


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


@pytest.mark.anyio
async def test_the_command_line_prints_the_split_the_budgets_and_a_departments_spending(
    served: tuple[Api, str],
) -> None:
    api, url = served
    async with client(api) as http:
        scene = await Scene(api, Factory(api, http)).build()
    admin = scene.make.admin
    period = ("--from", _iso(NOW - 7200), "--to", _iso(NOW))
    done = _cli(url, admin, "report", "usage", *period, "--by", "department")
    assert done.returncode == 0, done.stderr
    a_budget = [scene.a, "$100.00", "$7.30", "$21.90", "$7.20", "$5.50", "$3.70", "over-budget"]
    b_budget = [scene.b, "$50.00", "$0.00", "$0.00", "$0.00", "$0.00", "$0.00", "pools-full"]
    # BY, GPU-HOURS, BUSY, IDLE, COST, ON-PREM, BURST, BUSY COST, IDLE COST; then the budget section.
    assert _rows(done.stdout) == [
        [scene.a, "1.50", "0.50", "1.00", "2.80", "1.00", "1.80", "0.90", "1.90"],
        ["total", "1.50", "0.50", "1.00", "2.80", "1.00", "1.80", "0.90", "1.90"],
        *sorted([a_budget, b_budget]),
    ]
    assert "burst budgets" in done.stdout
    as_csv = _cli(url, admin, "report", "usage", *period, "--by", "department", "-o", "csv")
    assert list(csv.reader(io.StringIO(as_csv.stdout)))[:2] == [
        ["department", "gpu_hours", "busy_gpu_hours", "idle_gpu_hours", "cost", "busy_cost", "idle_cost",
         "on_prem_cost", "burst_cost", "burst_gpu_hours", "runs"],
        [scene.a, "1.5", "0.5", "1.0", "2.8", "0.9", "1.9", "1.0", "1.8", "1.0", "1"],
    ]  # fmt: skip

    shown = _cli(url, scene.m, "department", "burst", scene.a)
    assert (shown.returncode, shown.stdout) == (0, (
        f"department {scene.a}: bursts for work waiting 30m, within $100.00 a month (paced, stops at it)\n"
        "  this month: $7.30 spent, $21.90 forecast; 1 node held, $7.20 an hour\n"
        "  refused at the last try: over-budget\n"
    ))  # fmt: skip
    refused = _cli(url, scene.m, "department", "burst", scene.a, "--no-paced")
    assert (refused.returncode, refused.stderr) == (1, "error: only an admin may do this\n")
    # What is not given keeps its value: the budget and the threshold stay.
    changed = _cli(url, admin, "department", "burst", scene.a, "--no-paced", "--let-finish")
    assert (changed.returncode, changed.stdout.splitlines()[0]) == (
        0, f"department {scene.a}: bursts for work waiting 30m, within $100.00 a month (not paced, lets work finish)"
    )  # fmt: skip
    bad = _cli(url, admin, "department", "burst", scene.a, "--budget=-5")
    assert (bad.returncode, bad.stderr) == (2, "error: --budget: Input should be greater than or equal to 0\n")
    both = _cli(url, admin, "department", "burst", scene.a, "--off", "--budget", "5")
    assert (both.returncode, both.stderr) == (2, "error: --off takes no --after or --budget\n")
