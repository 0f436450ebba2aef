"""The volumes and files API, for the CLI and scripts: a project's volumes, and a workload's files."""

from __future__ import annotations

from pydantic import TypeAdapter

from gpupool.client.client import Client, _q
from gpupool.models.volumes import FileEntry, FilesPut, VolumeCreate, VolumePublic


def create_volume(client: Client, project: str, name: str, size: str) -> VolumePublic:
    body = VolumeCreate(project=project, name=name, size=size)
    resp = client._call("POST", "/api/v1/volumes", json=body.model_dump(mode="json"))
    return VolumePublic.model_validate(resp.json())


def list_volumes(client: Client, project: str) -> list[VolumePublic]:
    resp = client._call("GET", "/api/v1/volumes", params={"project": project})
    return TypeAdapter(list[VolumePublic]).validate_python(resp.json())


def delete_volume(client: Client, project: str, name: str) -> None:
    client._call("DELETE", f"/api/v1/volumes/{_q(name)}", params={"project": project})


def _files(ref: str) -> str:
    return f"/api/v1/workloads/{_q(ref)}/files"


def list_files(client: Client, ref: str, path: str = "", rank: int = 0, project: str | None = None) -> list[FileEntry]:
    params: dict[str, str | int] = {"path": path, "rank": rank, "list": 1}
    if project:
        params["project"] = project
    resp = client._call("GET", _files(ref), params=params)
    return TypeAdapter(list[FileEntry]).validate_python(resp.json())


def get_files(client: Client, ref: str, path: str, rank: int = 0, project: str | None = None) -> tuple[bytes, bool]:
    """A file's bytes, or (a directory) a tar of it; and whether it is a tar."""
    params: dict[str, str | int] = {"path": path, "rank": rank}
    if project:
        params["project"] = project
    resp = client._call("GET", _files(ref), params=params)
    return resp.content, resp.headers.get("content-type", "").startswith("application/x-tar")


def put_files(client: Client, ref: str, path: str, tar: bytes, rank: int = 0, project: str | None = None) -> FilesPut:
    """Extract a tar into the workload's working directory, under `path`."""
    params: dict[str, str | int] = {"path": path, "rank": rank}
    if project:
        params["project"] = project
    resp = client._call("PUT", _files(ref), params=params, content=tar,
                        headers={"content-type": "application/x-tar"})  # fmt: skip
    return FilesPut.model_validate(resp.json())
