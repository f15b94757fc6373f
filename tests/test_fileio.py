"""Whole-file writes: a write interrupted anywhere leaves neither a partial file
nor a temporary one."""

from __future__ import annotations

import os

import pytest

from snsim import fileio


def test_an_interrupt_right_after_the_temporary_file_is_made_leaves_nothing(
        tmp_path, monkeypatch):
    # Ctrl-C arriving just after the temporary file exists (inside mkstemp, before
    # its name was returned, a sweep's interrupted write left '.x.json.*' behind)
    real_open = os.open

    def open_then_interrupt(*args, **kwargs):
        fd = real_open(*args, **kwargs)
        os.close(fd)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "open", open_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        fileio.write_json(tmp_path / "x.json", {"a": 1})
    monkeypatch.setattr(os, "open", real_open)
    assert list(tmp_path.iterdir()) == []


def test_an_interrupt_while_writing_leaves_the_old_file(tmp_path):
    target = tmp_path / "x.json"
    fileio.write_json(target, {"a": 1})
    before = target.read_text()
    with pytest.raises(KeyboardInterrupt):
        with fileio.atomic_path(target) as tmp:
            tmp.write_text("{partial")
            raise KeyboardInterrupt
    assert target.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_written_files_get_a_normal_mode(tmp_path):
    umask = os.umask(0o022)
    try:
        fileio.write_json(tmp_path / "x.json", {"a": 1})
    finally:
        os.umask(umask)
    assert (tmp_path / "x.json").stat().st_mode & 0o777 == 0o644
