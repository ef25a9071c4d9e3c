"""``histocal demo``'s limits: its numbers bounded before anything is written, and its working
folder removed when it is stopped (Ctrl-C or SIGTERM)."""

from __future__ import annotations

import os
import signal
import tempfile

import pytest

from histocal.cli import demo, main


@pytest.mark.parametrize("flag", ["--samples", "--batch-size"])
@pytest.mark.parametrize("value", ["9223372036854775807", "10001"])
def test_demo_numbers_are_bounded_before_anything_is_written(tmp_path, monkeypatch, capsys, flag, value):
    monkeypatch.setattr(tempfile, "tempdir", tmp_path.as_posix())
    assert main(["demo", flag, value]) == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: expected an integer in [1, 10000], got {value}" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_demo_leaves_no_folder(tmp_path, monkeypatch, capsys, stop):
    monkeypatch.setattr(tempfile, "tempdir", tmp_path.as_posix())

    def stopped(*args, **kwargs):
        assert [p.name[:14] for p in tmp_path.iterdir()] == ["histocal-demo."]  # the folder exists now
        os.kill(os.getpid(), stop)  # as `kill PID` or Ctrl-C while the demo runs
        raise AssertionError("the signal did not stop the demo")

    monkeypatch.setattr(demo, "_demo_model", stopped)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["demo", "--samples", "2"]) == 130
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is before  # the demo's handler is gone with it
    assert "interrupted" in capsys.readouterr().err
