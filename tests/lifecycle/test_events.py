"""The sentences events render: a member's exit by signal is named, an abort says what causes it most often, and an
offboarding's cancel says whose work it was and why."""

from __future__ import annotations

from gpupool.lifecycle.events import EventCode, render
from gpupool.lifecycle.phases import StopReason


def test_a_member_ended_by_a_signal_names_it_and_an_abort_says_what_to_do() -> None:
    def failed(code: int | None) -> str:
        return render(EventCode.FAILED, StopReason.MEMBER_FAILED, {"member": 0, "exit_code": code})

    assert failed(3) == "member 0 exited with code 3"
    assert failed(137) == "member 0 exited with code 137 (SIGKILL)"
    assert failed(134) == (
        "member 0 exited with code 134 (SIGABRT: it aborted; a PyTorch script that leaves its process group open "
        "can, at exit: call dist.destroy_process_group() before it returns)"
    )
    assert failed(255) == "member 0 exited with code 255"
    assert failed(None) == "member 0 exited with an unknown status (killed or lost)"


def test_an_offboardings_cancel_says_whose_work_and_why() -> None:
    args = {"by": "admin", "offboarded": "removed", "owner": "ana", "project": "vision"}
    removed = "cancelled by admin: its owner ana was removed from project vision"
    assert render(EventCode.CANCELLED, None, args) == removed
    assert render(EventCode.CANCELLED, None, {**args, "offboarded": "disabled"}) == (
        "cancelled by admin: its owner ana was disabled"
    )
    assert render(EventCode.STOP_REQUESTED, StopReason.CANCEL, {**args, "offboarded": "deleted"}) == (
        "cancelled by admin: its owner ana was deleted; stopping"
    )
    assert render(EventCode.CANCELLED, None, {"by": "ana"}) == "cancelled by ana"
