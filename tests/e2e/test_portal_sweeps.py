"""The portal's sweeps pages, and a workload's MLflow run (on a real MLflow server) and model on its page, in a
real browser (Playwright driving Debian's chromium) against a real server on simulated GPUs: an Optuna sweep of three
trials listed, its best trial, its trials linking to their workloads, Optuna's plot as the server draws it; a
viewer's cancel refused with the API's words, the owner's taken."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from playwright.sync_api import Browser, Page, expect

from tests.e2e.conftest import Server, wait_for
from tests.e2e.envs import mlflow as mlflow
from tests.e2e.sweeps import trials_said
from tests.e2e.test_portal import shot, token_page

# (x - 2)² of a whole x: values the CLI and the page print alike.
OBJECTIVE = "import sys; x = int(sys.argv[1]); print(f'gpupool.result value={(x - 2) ** 2}', flush=True)"
SEARCH = {
    "name": "search",
    "project": "vision",
    "command": [sys.executable, "-c", OBJECTIVE, "{x}"],
    "space": {"x": {"type": "int", "low": 0, "high": 5}},
    "metric": "loss",
    "direction": "minimize",
    "trials": 3,
    "parallelism": 3,
    "sampler": {"kind": "random", "seed": 3},
    "pruner": {"kind": "none"},
    "gpu": 0.25,
}
# A sweep that stays running: its one trial at a time sleeps.
SLOW = SEARCH | {"name": "slow", "command": ["sleep", "300"], "trials": 2, "parallelism": 1}


def _token_page(browser: Browser, s: Server, token: str, who: str) -> Page:
    """A page of its own (its own cookies), signed in with `token`."""
    page = token_page(browser, s.url, token)
    expect(page.locator("#who")).to_have_text(who)
    return page


def _start(s: Server, spec: dict[str, Any], token: str) -> None:
    path = s.cwd / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    s.cli("sweep", "-f", str(path), token=token)


def _sweep(s: Server, name: str) -> dict[str, Any]:
    return dict(s.json("sweep", "describe", name, "-p", "vision"))


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_sweeps_pages_list_describe_plot_and_cancel_for_members_only(
    make_server: Callable[..., Server], browser: Browser
) -> None:
    s = make_server("fake:2xH100-80GB")
    s.cli("project", "create", "vision", "--deserved-gpus", "2")
    ana = s.json("user", "create", "ana", "--project", "vision")["token"]
    vic = s.json("user", "create", "vic", "--role", "viewer", "--project", "vision")["token"]
    _start(s, SEARCH, ana)
    done = wait_for(lambda: (d := _sweep(s, "search"))["state"] == "succeeded" and d, 90, "the sweep to end")
    assert [t["state"] for t in done["trial_list"]] == ["complete"] * 3, trials_said(s, "search")
    assert done["best"]["value"] == min(t["value"] for t in done["trial_list"]), trials_said(s, "search")
    _start(s, SLOW, ana)
    wait_for(lambda: any(t["state"] == "running" for t in _sweep(s, "slow")["trial_list"]), 60, "a slow trial")

    page = _token_page(browser, s, vic, "vic (viewer)")
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    page.click("nav a[data-page=sweeps]")
    expect(page.locator("nav a.active")).to_have_text("Sweeps")
    row = page.locator("#sweeps tr[data-sweep='vision/search']")
    best = done["best"]
    expect(row.locator(".state")).to_have_text("succeeded")
    expect(row.locator(".done .count")).to_have_text("3 / 3")
    expect(row.locator(".done .reason")).to_have_text("3 complete")
    expect(row.locator(".best .value")).to_have_text(f"{best['value']:.6g}")
    expect(row.locator(".objective")).to_have_text("minimize loss")
    expect(page.locator("#sweeps tr[data-sweep='vision/slow'] .state")).to_have_text("running")
    shot(page, "15-sweeps")

    row.locator("a.sw-link").click()
    expect(page).to_have_url(f"{s.url}/#/sweeps/vision/search")
    expect(page.locator("#sw-state")).to_have_text("succeeded")
    expect(page.locator("#sw-best-number")).to_have_text(str(best["number"]))
    expect(page.locator("#sw-best-value")).to_have_text(f"{best['value']:.6g}")
    expect(page.locator("#sw-best-params")).to_have_text(f"x={best['params']['x']}")
    expect(page.locator("#sw-trials tbody tr")).to_have_count(3)
    for t in done["trial_list"]:
        tr = page.locator(f"#sw-trials tr[data-trial='{t['number']}']")
        expect(tr.locator(".state")).to_have_text("complete")
        expect(tr.locator(".value")).to_have_text(f"{t['value']:.6g}")
        expect(tr.locator(".params")).to_have_text(f"x={t['params']['x']}")
        expect(tr.locator("a.wl-link")).to_have_text(t["workload"])
    expect(page.locator("#sw-actions button")).to_have_count(0)  # an ended sweep has nothing to cancel
    # Optuna's plot, fetched with the session and shown as an image the page's policy lets in.
    width = "() => { const i = document.querySelector('#sw-plot-img'); return i && i.complete ? i.naturalWidth : 0; }"
    assert wait_for(lambda: page.evaluate(width), 30, "the plot to load") > 100
    assert refused == []
    shot(page, "16-sweep")

    first = done["trial_list"][0]["workload"]
    page.locator("#sw-trials tr[data-trial='0'] a.wl-link").click()
    expect(page).to_have_url(f"{s.url}/#/workloads/vision/{first}")
    expect(page.locator("#wl-state")).to_have_text("succeeded")

    # A viewer reads the running sweep, and is refused its cancel with the API's words.
    page.goto(f"{s.url}/#/sweeps/vision/slow")
    expect(page.locator("#sw-state")).to_have_text("running")
    page.once("dialog", lambda d: d.accept())
    page.locator("#sw-actions [data-action=cancel]").click()
    expect(page.locator("#sw-err")).to_have_text("your role (viewer) cannot cancel sweeps in 'vision'")
    assert _sweep(s, "slow")["state"] == "running"

    owner = _token_page(browser, s, ana, "ana (member)")
    owner.goto(f"{s.url}/#/sweeps/vision/slow")
    expect(owner.locator("#sw-state")).to_have_text("running")
    asked: list[str] = []
    owner.once("dialog", lambda d: (asked.append(d.message), d.accept()))
    owner.locator("#sw-actions [data-action=cancel]").click()
    expect(owner.locator("#sw-state")).to_have_text("cancelled")
    expect(owner.locator("#sw-actions button")).to_have_count(0)
    expect(owner.locator("#sw-err")).to_have_text("")
    assert asked == ["Cancel the sweep slow? No new trial starts, and the running ones are stopped."]
    assert _sweep(s, "slow")["state"] == "cancelled"
    # The viewer's page follows it.
    expect(page.locator("#sw-state")).to_have_text("cancelled", timeout=10_000)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_workload_page_links_its_mlflow_run_and_names_the_model_it_serves(
    make_server: Callable[..., Server], browser: Browser, mlflow: str
) -> None:
    s = make_server("fake:1xH100-80GB")
    s.cli("project", "create", "vision", "--deserved-gpus", "1")
    s.cli("project", "set", "vision", "--production-allowed")
    ana = s.json("user", "create", "ana", "--project", "vision")["token"]
    s.cli("submit", "-p", "vision", "--name", "train", "--gpu", "0.25", "--mlflow", mlflow, "--no-code",
          "--", "sleep", "300", token=ana)  # fmt: skip
    run = str(wait_for(lambda: s.workload("train")["mlflow_run_url"], 60, "its MLflow run"))
    assert run.startswith(f"{mlflow}/#/experiments/")
    # Nothing listens at its tracking server: it may not start, but it names its model all the same.
    s.cli("submit", "-p", "vision", "--name", "serve", "--type", "inference", "--model", "models:/doubler/1",
          "--mlflow", "http://127.0.0.1:9", "--no-code", "--gpu", "0.25", token=ana)  # fmt: skip

    page = _token_page(browser, s, ana, "ana (member)")
    page.goto(f"{s.url}/#/workloads/vision/train")
    expect(page.locator("#wl-state")).to_have_text("running")
    link = page.locator("#wl-summary tr[data-row='MLflow run'] td a")
    expect(link).to_have_text(run)
    expect(link).to_have_attribute("href", run)
    expect(link).to_have_attribute("target", "_blank")
    expect(link).to_have_attribute("rel", "noopener noreferrer")
    expect(page.locator("#wl-summary tr[data-row=Model]")).to_have_count(0)
    shot(page, "17-workload-mlflow")

    page.goto(f"{s.url}/#/workloads/vision/serve")
    expect(page.locator("#workload-page[data-name=serve]")).to_be_visible()
    expect(page.locator("#wl-summary tr[data-row=Model] td")).to_have_text("models:/doubler/1")
    expect(page.locator("#wl-summary tr[data-row='MLflow run']")).to_have_count(0)  # a served model makes no run
