"""The workload file of `gpupool apply -f`: `resources:` read as submit's flags, and the JSON Schema editors check
it with, taken from the API's own model."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from gpupool.cli.spec import SpecError, fields, normalise, schema
from gpupool.models.schemas import WorkloadCreate
from tests.e2e.conftest import GPUPOOL

FILE = """\
project: vision
name: train
max-duration: 4h
resources:
  gpus: 2
  gpu-memory: 40GiB
  cpu: 4
  memory: 16GiB
  gpu_model: [H100, A100]
  pools: big
command: [python, train.py]
"""


def test_resources_become_the_api_fields() -> None:
    data = normalise(yaml.safe_load(FILE))
    body = WorkloadCreate.model_validate(data)
    assert (body.gpus, body.gpu_memory, body.cpu, body.memory) == (2, "40GiB", 4.0, "16GiB")
    assert (body.gpu_models, body.pools, body.max_duration_s) == (["H100", "A100"], ["big"], 14400.0)
    assert normalise({"resources": {"gpu_model": "H100"}}) == {"gpu_models": ["H100"]}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"gpus": 1, "resources": {"gpus": 2}}, "resources.gpus: gpus is given at the top level too; give it once"),
        ({"resources": {"tpus": 2}}, "resources.tpus: unknown; did you mean 'gpus'? expected one of gpu, gpus, "
         "gpu_memory, cpu, memory, gpu_model, pools"),
        ({"resources": {"colour": 2}}, "resources.colour: unknown; expected one of gpu, gpus, gpu_memory, cpu, memory, "
         "gpu_model, pools"),
        ({"resourses": {"gpus": 1}}, "resourses: unknown; did you mean 'resources'? `gpupool apply --schema` lists "
         "every field"),
        ({"comand": ["true"]}, "comand: unknown; did you mean 'command'? `gpupool apply --schema` lists every field"),
        ({"max-durations": "4h"}, "max-durations: unknown; did you mean 'max_duration'? `gpupool apply --schema` "
         "lists every field"),
        ({"colour": "red"}, "colour: unknown; `gpupool apply --schema` lists every field"),
        ({"resources": {"gpu_model": [1]}}, "resources.gpu_model: expected a name or a list of names"),
        ({"resources": [1]}, "resources: expected a mapping of gpu, gpus, gpu_memory, cpu, memory, gpu_model, pools"),
        ({"grace": "soon"}, "grace: 'soon' is not a duration (like 30m, 1h30m, 3d, 90s or seconds)"),
    ],
)  # fmt: skip
def test_a_bad_resources_block_names_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError) as e:
        normalise(data)
    assert str(e.value) == message


def test_apply_of_a_typo_at_the_top_level_names_the_field_it_meant(tmp_path: Path) -> None:
    # Refused as the file is read, before any server is asked (none is configured here).
    (tmp_path / "job.yaml").write_text("project: vision\nresourses:\n  gpus: 1\ncommand: [true]\n")
    done = subprocess.run([GPUPOOL, "apply", "-f", "job.yaml"], capture_output=True, text=True, cwd=tmp_path,
                          env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)})  # fmt: skip
    assert (done.returncode, done.stderr) == (2, "error: job.yaml: resourses: unknown; did you mean 'resources'? "
                                                 "`gpupool apply --schema` lists every field\n")  # fmt: skip


def test_the_file_and_its_schema_know_the_same_top_level_keys() -> None:
    assert set(fields()) == set(schema()["properties"])


def test_the_published_schema_accepts_the_file_and_refuses_what_apply_refuses() -> None:
    published = json.loads(subprocess.run([GPUPOOL, "apply", "--schema"], capture_output=True, text=True,
                                          check=True).stdout)  # fmt: skip
    assert published == schema()
    jsonschema.Draft202012Validator.check_schema(published)
    validator = jsonschema.Draft202012Validator(published)
    assert list(validator.iter_errors(yaml.safe_load(FILE.replace("max-duration", "max_duration")
                                                     .replace("gpu-memory", "gpu_memory")))) == []  # fmt: skip
    bad = [{"gpus": 1, "colour": "red"}, {"resources": {"tpus": 1}}, {"resources": {"gpu_model": [1]}}]
    assert [len(list(validator.iter_errors(b))) > 0 for b in bad] == [True, True, True]
    # Every field the API takes is in the file's schema (the durations as text), so the two cannot drift apart.
    api = set(WorkloadCreate.model_fields) - {"max_duration_s", "grace_s"}
    assert api <= set(published["properties"])
