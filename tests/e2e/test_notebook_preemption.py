"""Issue 32, item 7, as its users met it: a member's 2-GPU training job preempts the two notebooks of its project on
a 2-GPU server (interactive work ranks below training). Each notebook is suspended with its files, its owner is told
why and when it will be back (`describe`, `list`, the portal's workload page), and once the job has ended both
start again by themselves, their files where they were. Real JupyterLabs behind the server's proxy, real processes
on simulated GPUs."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from tests.e2e.conftest import Server, wait_for
from tests.e2e.jupyter import put_file, read_file
from tests.e2e.test_portal import token_page

DONE = "until [ -e done ]; do sleep 0.1; done"
"""The training job: it ends once the test leaves a file named done in its working directory."""


def _utc(seconds: float) -> str:
    return dt.datetime.fromtimestamp(int(seconds), dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# The portal half needs one store; the lifecycle under it runs on both in tests/lifecycle and tests/control.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_training_job_suspends_two_notebooks_which_come_back_by_themselves_with_their_files(
    make_server: Callable[..., Server], browser: Browser
) -> None:
    s = make_server("fake:2xH100-80GB")
    s.cli("project", "create", "lab", "--deserved-gpus", "2")
    owners = {"nb1": s.json("user", "create", "ana", "--project", "lab")["token"]}
    owners["nb2"] = s.json("user", "create", "bo", "--project", "lab")["token"]
    for name, token in owners.items():
        s.cli("submit", "-p", "lab", "--type", "notebook", "--name", name, "--gpus", "1", token=token)
    bases: dict[str, str] = {}
    for name, token in owners.items():
        s.wait_state(name, "running", timeout=120)
        bases[name] = s.cli("open", name, token=token).stdout.strip()
        put_file(bases[name], token, "notes.txt", f"written by {name}")

    s.cli("submit", "-p", "lab", "--name", "train", "--gpus", "2", "--max-duration", "1h", "--", "sh", "-c", DONE,
          token=owners["nb1"])  # fmt: skip
    train = s.wait_state("train", "running", timeout=60)
    suspended = {name: s.wait_state(name, "suspended", timeout=60) for name in owners}
    ends = {name: [e["at"] for e in w["events"] if e["code"] == "suspended"] for name, w in suspended.items()}
    assert all(len(at) == 1 for at in ends.values()), ends
    # The job's declared hour bounds the notebooks' wait: the scheduler's estimate is its end.
    eta = _utc(train["started_at"] + 3600)

    def told(name: str) -> dict[str, Any] | None:
        w = s.workload(name, token=owners[name])
        return w if w["eta"] is not None and w["reason_code"] is not None else None

    for name, token in owners.items():
        w = wait_for(lambda n=name: told(n), 60, f"{name}'s estimate")
        at = ends[name][0]
        notice = (
            f"suspended: preempted by 'train' (training) at {_utc(at)}; resumes by itself when 1 GPU is free in "
            f"pool default, ETA {eta}"
        )
        assert w["suspension"] == {
            "reason": "preempt", "at": at, "by": "train", "by_priority": "training", "by_project": "lab",
            "pool": "default", "resumes": "automatically", "notice": notice,
        }  # fmt: skip
        assert (w["state"], w["reason"], w["reason_code"]) == ("suspended", notice, "no-node-fits")
        assert w["attempts"][0]["outcome"] == "requeued" and w["attempts"][0]["reason"] == "preempt"
        # Its files stay in its working directory while it is away.
        assert (s.data_dir / "workloads" / str(w["id"]) / "notes.txt").read_text() == f"written by {name}"
        out = s.cli("describe", name, token=token).stdout.splitlines()
        assert f"Reason:      {notice} [no-node-fits]" in out
        assert "State:       suspended (attempt 2)" in out
        brief = f"preempted by 'train' (training) at {_utc(at)[11:16]} UTC; resumes when 1 GPU is free in default"
        listed = {x["name"]: x for x in s.json("list", "-p", "lab", token=token)}
        assert (listed[name]["state"], listed[name]["reason_short"]) == ("suspended", brief)
    # The table wraps REASON at word boundaries: each notebook's first line names the state and who took its GPUs.
    s.env["COLUMNS"] = "200"
    firsts = {line.split("│")[1].strip(): line for line in s.cli("list", "-p", "lab").stdout.splitlines()[3:-1]}
    for name in owners:
        assert "│ suspended │" in firsts[name] and "│ preempted by 'train' " in firsts[name], firsts

    # The owner's page says the same, and offers no Resume: it comes back by itself.
    page = token_page(browser, s.url, owners["nb2"])
    page.goto(f"{s.url}/#/workloads/lab/nb2")
    expect(page.locator("#wl-state")).to_have_text("suspended")
    expect(page.locator("#wl-reason")).to_have_text(s.workload("nb2")["suspension"]["notice"])
    expect(page.locator("#wl-reason")).to_have_attribute("data-resumes", "automatically")
    expect(page.locator("#wl-actions [data-action=cancel]")).to_be_visible()
    expect(page.locator("#wl-actions [data-action=resume]")).to_have_count(0)

    (s.data_dir / "workloads" / str(train["id"]) / "done").touch()
    s.wait_state("train", "succeeded", timeout=30)
    for name, token in owners.items():
        back = s.wait_state(name, "running", timeout=120)
        assert (back["suspension"], back["attempt"]) == (None, 1)
        assert s.cli("open", name, token=token).stdout.strip() == bases[name]  # the same address
        assert read_file(bases[name], token, "notes.txt") == f"written by {name}"
    expect(page.locator("#wl-state")).to_have_text("running", timeout=10_000)
    page.close()
