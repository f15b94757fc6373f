"""The profiler validates a document once: ``profile`` then ``write`` of it."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from snsim.errors import TraceError  # noqa: E402
from snsim.profile import profiler  # noqa: E402
from snsim.trace import load  # noqa: E402


@pytest.fixture
def counted(monkeypatch):
    calls = []
    real = profiler.from_dict

    def counting(doc, label="<trace>"):
        calls.append(label)
        return real(doc, label)
    monkeypatch.setattr(profiler, "from_dict", counting)
    return calls


def test_profile_then_write_validates_once(counted, tmp_path):
    doc = profiler.profile("resnet18", 2, (3, 32, 32), device_model="k40c")
    path = tmp_path / "a.json"
    profiler.write(doc, path)
    assert len(counted) == 1          # profile's; write saw the same text
    assert load(path).model == doc["model"]


def test_a_changed_document_is_validated_again(counted, tmp_path):
    doc = profiler.profile("resnet18", 2, (3, 32, 32), device_model="k40c")
    doc["layers"][1]["name"] = "renamed"
    profiler.write(doc, tmp_path / "ok.json")
    assert len(counted) == 2
    assert json.loads((tmp_path / "ok.json").read_text())["layers"][1]["name"] == "renamed"
    doc["layers"][1]["param_bytes"] = -4
    with pytest.raises(TraceError, match="field param_bytes: -4 is less than the minimum"):
        profiler.write(doc, tmp_path / "bad.json")
    assert not (tmp_path / "bad.json").exists()
