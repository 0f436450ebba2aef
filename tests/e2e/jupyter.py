"""Talking to a real JupyterLab through gpupool's app proxy the way a user's client would: files through its REST
API, code through a kernel's websocket, authenticated with the caller's gpupool token."""

from __future__ import annotations

import json
import uuid

import httpx
from websockets.sync.client import connect


def put_file(base: str, token: str, name: str, text: str) -> None:
    body = {"type": "file", "format": "text", "content": text}
    r = httpx.put(f"{base}api/contents/{name}", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    r.raise_for_status()


def read_file(base: str, token: str, name: str) -> str:
    r = httpx.get(f"{base}api/contents/{name}", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    r.raise_for_status()
    return str(r.json()["content"])


def run_in_kernel(base: str, token: str, code: str) -> None:
    """Start a kernel and send it `code` without waiting for it to finish (a busy loop, say)."""
    r = httpx.post(
        f"{base}api/kernels", json={"name": "python3"}, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    r.raise_for_status()
    kernel = r.json()["id"]
    ws_url = base.replace("http://", "ws://") + f"api/kernels/{kernel}/channels"
    session = uuid.uuid4().hex
    message = {
        "header": {"msg_id": uuid.uuid4().hex, "username": "test", "session": session, "msg_type": "execute_request",
                   "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True},
    }  # fmt: skip
    with connect(ws_url, open_timeout=30, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        ws.send(json.dumps(message))
        # The kernel says it is busy once it has the request; then we can go.
        for _ in range(100):
            reply = json.loads(ws.recv(timeout=30))
            if reply.get("msg_type") == "status" and reply["content"].get("execution_state") == "busy":
                return
    raise AssertionError("the kernel never started the code")
