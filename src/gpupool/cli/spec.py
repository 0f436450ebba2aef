"""The workload file `gpupool apply -f` reads: its `resources:` block and human durations turned into the API's
fields, and the JSON Schema of the file that editors validate it with (`gpupool apply --schema`)."""

from __future__ import annotations

import difflib
from typing import Any

from gpupool.durations import parse_duration
from gpupool.models.schemas import WorkloadCreate

RESOURCES = ("gpu", "gpus", "gpu_memory", "cpu", "memory", "gpu_model", "pools")
"""The keys of `resources:`; `gpu_model` and `pools` take one name or a list."""
_LISTS = {"gpu_model": "gpu_models", "pools": "pools"}
DURATIONS = (("max_duration", "max_duration_s"), ("grace", "grace_s"))
"""Written as people write them in the file (`4h`, `30s`); the API's fields are in seconds."""


FILE_ONLY = ("resources", "workdir", "env_file", "idempotency_key")
"""Keys of the file that are not the API's fields (read here, or by apply, before the workload is sent)."""


class SpecError(ValueError):
    """A workload file that cannot become a WorkloadCreate; the message names the key."""


def _unknown(raw: str, key: str, known: list[str], rest: str) -> SpecError:
    """A key the file may not have, with the known one it most likely meant (a typo is likelier than a new field),
    then `rest`: where the keys it may have are."""
    like = difflib.get_close_matches(key, known, n=1)
    return SpecError(f"{raw}: unknown; {f'did you mean {like[0]!r}? ' if like else ''}{rest}")


def fields() -> list[str]:
    """The top-level keys of a workload file, as its schema has them: the API's fields, durations as the file
    writes them (max_duration, not max_duration_s), and the file's own keys."""
    seconds = {api for _, api in DURATIONS}
    return [*(f for f in WorkloadCreate.model_fields if f not in seconds), *(f for f, _ in DURATIONS), *FILE_ONLY]


def _names(key: str, value: Any) -> list[Any]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise SpecError(f"resources.{key}: expected a name or a list of names")


def flatten_resources(data: dict[str, Any]) -> None:
    """`resources: {gpus: 1, gpu_model: [H100, A100]}` as the top-level fields submit sends; a field given both
    there and at the top level is refused rather than one silently winning."""
    if "resources" not in data:
        return
    block = data.pop("resources")
    if block is None:
        return
    if not isinstance(block, dict):
        raise SpecError(f"resources: expected a mapping of {', '.join(RESOURCES)}")
    for raw, value in block.items():
        key = str(raw).replace("-", "_")
        if key not in RESOURCES:
            raise _unknown(f"resources.{raw}", key, list(RESOURCES), f"expected one of {', '.join(RESOURCES)}")
        field = _LISTS.get(key, key)
        if field in data:
            raise SpecError(f"resources.{raw}: {field} is given at the top level too; give it once")
        data[field] = _names(key, value) if key in _LISTS else value


def parse_durations(data: dict[str, Any]) -> None:
    for field, api in DURATIONS:
        if field not in data:
            continue
        declared = data.pop(field)
        try:
            data[api] = None if declared is None else parse_duration(str(declared))
        except ValueError as e:
            raise SpecError(f"{field}: {e}") from None


def normalise(data: dict[str, Any]) -> dict[str, Any]:
    """The file's mapping with `-` in keys read as `_`, `resources:` flattened and durations in seconds; a key
    that is none of these is refused here, with the field it most likely meant, rather than by the API's model."""
    out = {str(k).replace("-", "_"): v for k, v in data.items()}
    known = fields()
    for raw in data:
        key = str(raw).replace("-", "_")
        if key not in known and key not in WorkloadCreate.model_fields:  # max_duration_s too, as the API has it
            raise _unknown(str(raw), key, known, "`gpupool apply --schema` lists every field")
    flatten_resources(out)
    parse_durations(out)
    return out


def _name_or_names(description: str) -> dict[str, Any]:
    item = {"type": "string", "minLength": 1}
    return {"description": description, "anyOf": [item, {"type": "array", "items": item, "maxItems": 16}]}


def schema() -> dict[str, Any]:
    """The JSON Schema of a workload file, from the API's own model so the two cannot drift: the API's fields,
    with durations as text, `resources:`, `workdir`, `env_file` and `idempotency_key` as the file has them.
    `project` is not required: apply takes the default project where the file names none."""
    base = WorkloadCreate.model_json_schema()
    props: dict[str, Any] = dict(base["properties"])
    duration = {"anyOf": [{"type": "string"}, {"type": "number", "exclusiveMinimum": 0}, {"type": "null"}]}
    for field, api in DURATIONS:
        props.pop(api)
        props[field] = duration | {"description": "A duration as people write it: 90s, 30m, 1h30m, 3d."}
    resources = {key: props[key] for key in RESOURCES if key in props}
    resources["gpu_model"] = _name_or_names("A GPU model it accepts, as nodes name them, or a list of them.")
    resources["pools"] = _name_or_names("A pool it may run in, or a list of them.")
    props["resources"] = {
        "type": "object",
        "description": "What each member needs; the same fields may be given at the top level instead.",
        "properties": resources,
        "additionalProperties": False,
    }
    props["workdir"] = {"type": "string", "description": "The directory sent as its code, relative to the file."}
    props["idempotency_key"] = {"type": "string", "minLength": 1, "maxLength": 128}
    props["env_file"] = {"type": "string", "description": "A file of KEY=VALUE lines, relative to the file; env wins."}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "gpupool workload",
        "description": "A workload for `gpupool apply -f`; keys may be written with - for _ (gpu-memory).",
        "type": "object",
        "properties": props,
        "additionalProperties": False,
        **({"$defs": base["$defs"]} if "$defs" in base else {}),
    }
