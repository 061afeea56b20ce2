"""Every `--json` carries `schema_version`, and real output validates against docs/schemas/.

The schema files are built from the tables' own column declarations (renderers/json_schema.py):
the first test fails when a file is stale. Then each command's real output is validated: analyze
and compare (and --per-process) on the sample traces, doctor and symbols on this machine,
record on the sample workload (eBPF), drive against a fake completion server. Documents with a
key removed or a column missing must fail, so the schemas say something.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from ckptrace.renderers.json import SCHEMA_VERSION
from ckptrace.renderers.json_schema import SCHEMAS, schema_text
from helpers import ckptrace, record_with_truth, validate_json as validate
from test_llama_server import fake_server  # noqa: F401 (a fixture)

jsonschema = pytest.importorskip("jsonschema")  # a test dependency (pyproject.toml's test extra)
REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "samples" / "traces"
LEGS = [SAMPLES / f"{n}.parquet" for n in ("1-pool-off", "2-pool-on", "3-pool-off")]


def invalid(name: str, doc: dict) -> bool:
    try:
        validate(name, doc)
    except jsonschema.ValidationError:
        return True
    return False


def out(*args) -> dict:
    p = ckptrace(*args, "--json", timeout=300)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["schema_version"] == SCHEMA_VERSION
    return doc


@pytest.mark.parametrize("name", SCHEMAS)
def test_the_schema_files_are_current(name):
    assert (REPO / "docs" / "schemas" / f"{name}.schema.json").read_text() == schema_text(name), \
        "stale: python -m ckptrace.renderers.json_schema docs/schemas"


def test_analyze_and_compare_validate_and_the_schemas_say_something():
    for leg in LEGS:
        doc = out("analyze", leg)
        validate("analyze", doc)
    broken = copy.deepcopy(doc)
    del broken["checkpoints"][0]["fill_ns"]
    assert invalid("analyze", broken)
    broken = copy.deepcopy(doc)
    broken["summary"]["stats"]["checkpoint_fill_ns"]["mean"] = "2.6"
    assert invalid("analyze", broken)
    doc = out("compare", *LEGS)
    validate("compare", doc)
    assert invalid("compare", {k: v for k, v in doc.items() if k != "schema_version"})
    assert invalid("compare", {**doc, "schema_version": SCHEMA_VERSION + 1})
    validate("compare", out("compare", *LEGS, "--per-process"))


def test_whatif_validates():
    doc = out("whatif", *LEGS[::2], "--cap-bytes", "1GiB")
    validate("whatif", doc)
    assert doc["processes"] and doc["processes"][0]["summary"]["gets"] > 0
    del doc["processes"][0]["outcomes"][0]["bytes"]
    assert invalid("whatif", doc)


@pytest.mark.ebpf
def test_doctor_symbols_and_record_validate(require_root_ebpf, workload, tmp_path):
    validate("doctor", out("doctor"))
    validate("symbols", out("symbols", workload))
    rec = record_with_truth(tmp_path, [workload, "--iterations", "2"])
    assert rec.summary["schema_version"] == SCHEMA_VERSION
    validate("record", rec.summary)


def test_drive_validates(fake_server):  # noqa: F811
    _, url = fake_server
    doc = out("drive", url, "--clients", "2", "--requests", "2")
    validate("drive", doc)
    assert len(doc["requests"]) == 2
