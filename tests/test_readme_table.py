"""tools/readme_table.py rewrites only README's generated block, from the report's columns."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("_readme_table", ROOT / "tools" / "readme_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ROW = {"op": "rms_norm", "workload": "W [3, 5]", "dtype": "bfloat16", "lnc": "2",
       "kernel_us_modeled_trn2": "12.345", "kernel_range_us_modeled_trn2": "10.0-14.0", "limit_us_modeled_trn2": "9.87",
       "efficiency_modeled_trn2": "0.8", "bound_by_modeled_trn2": "dma", "eager_us_modeled_trn2": "98.7",
       "speedup_modeled_trn2": "8.0", "speedup_range_modeled_trn2": "7.00x-9.00x", "lnc_ratio_modeled_trn2": "0.55",
       "goal": "eff>=0.8", "status": "ok"}


def test_rewrites_the_block_between_the_markers_and_nothing_else(tmp_path):
    tool = _tool()
    report = tmp_path / "report.csv"
    with open(report, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(ROW))
        w.writeheader()
        w.writerow(ROW)
        w.writerow({**ROW, "op": "rms_norm backward"})
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{tool.BEGIN}\nold table\n{tool.END}\nbetween\n"
                      f"{tool.BACKWARD_BEGIN}\nold backward\n{tool.BACKWARD_END}\nafter\n")
    tool.main(["--report", str(report), "--readme", str(readme)])
    text = readme.read_text()
    assert text.startswith(f"before\n{tool.BEGIN}\n") and text.endswith(f"{tool.BACKWARD_END}\nafter\n")
    assert "old table" not in text and "between" in text
    forward, backward = text.split("between")
    assert "| rms_norm |" in forward and "| rms_norm backward |" in backward
    assert "rms_norm backward" not in forward
    assert ("| rms_norm | W [3, 5] | bfloat16 | 12.3 (10.0-14.0) | 9.9 | 0.80 | dma | 98.7 | 8.00x (7.00x-9.00x) "
            "| 0.55 | eff>=0.8 | ok |") in text
    assert "modeled" in text and "LNC=2: both NeuronCores" in text


def test_an_lnc1_report_says_one_core():
    assert "LNC=1: one NeuronCore;" in _tool().table([{**ROW, "lnc": "1"}])


def test_markers_in_the_wrong_order_are_an_error():
    tool = _tool()
    with pytest.raises(ValueError, match="modeled-table"):
        tool.rewrite(f"{tool.END}\nx\n{tool.BEGIN}\n", "table")


def test_a_readme_without_the_markers_is_an_error():
    with pytest.raises(ValueError, match="modeled-table"):
        _tool().rewrite("no markers here", "table")


def test_an_empty_report_is_an_error():
    with pytest.raises(ValueError, match="no rows"):
        _tool().table([])


def test_the_readme_has_the_markers():
    text = (ROOT / "README.md").read_text()
    tool = _tool()
    assert text.index(tool.BEGIN) < text.index(tool.END)
