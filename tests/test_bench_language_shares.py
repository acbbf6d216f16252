"""bench/language_shares.py: the language guess's counts per collection, as a table and JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import language_shares  # noqa: E402


def test_each_collection_gets_its_shares_and_guess(tmp_path, capsys):
    fr = tmp_path / "fr.jsonl"
    fr.write_text(
        "".join(
            json.dumps(
                {"id": f"d{i}", "contents": "Le chat dort sur le canapé et les enfants sont dans la cuisine."}
            )
            + "\n"
            for i in range(5)
        )
    )
    en = tmp_path / "en.jsonl"
    en.write_text(
        json.dumps({"id": "a", "contents": "The cat is asleep on the sofa and the children are out."}) + "\n"
    )
    out = tmp_path / "shares.json"
    assert language_shares.main([str(fr), str(en), "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["guess"] for r in rows] == ["fr", "en"] and rows[1]["english_share"] > 0.2
    assert "| fr " in capsys.readouterr().out
