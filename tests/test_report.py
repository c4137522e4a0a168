import json
import math

import pytest

from sparsekv.report import NotebookCheckError, write_metrics


def test_nan_metric_fails_loudly(tmp_path):
    with pytest.raises(NotebookCheckError, match="'recall' is nan"):
        write_metrics(tmp_path / "m.json", "x", {"recall": math.nan}, {})


def test_failed_check_raises_after_writing(tmp_path):
    with pytest.raises(NotebookCheckError, match="oracle beats minmax"):
        write_metrics(tmp_path / "m.json", "x", {"a": 1}, {"oracle beats minmax": False})
    assert json.loads((tmp_path / "m.json").read_text())["checks"] == {"oracle beats minmax": False}


def test_kinds_default_to_numeric_and_unknown_names_are_rejected(tmp_path):
    rec = write_metrics(tmp_path / "m.json", "x", {"a": 1, "b": 0.5}, {"ok": True}, kinds={"a": "exact"})
    assert rec["kinds"] == {"a": "exact", "b": "numeric"}
    with pytest.raises(ValueError, match="not recorded"):
        write_metrics(tmp_path / "m.json", "x", {"a": 1}, {}, headline=["zzz"])
