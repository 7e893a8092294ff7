"""runwatch.core.files: replace_if, the compare-and-swap the console's Apply writes with."""

from __future__ import annotations

import os

from runwatch.core.files import replace_if


def test_the_text_read_is_swapped_for_the_new_one_and_kept(tmp_path):
    path, kept = tmp_path / "alerts.yml", tmp_path / "alerts.yml.previous"
    path.write_text("old\n")
    os.chmod(path, 0o640)
    assert replace_if(path, "old\n", "new\n", keep=kept)
    assert path.read_text() == "new\n" and kept.read_text() == "old\n"
    assert path.stat().st_mode & 0o777 == 0o640  # the file's own mode, not mkstemp's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alerts.yml", "alerts.yml.previous"]


def test_a_file_saved_since_it_was_read_is_left_as_saved(tmp_path):
    path, kept = tmp_path / "alerts.yml", tmp_path / "alerts.yml.previous"
    path.write_text("saved by the learner\n")
    assert not replace_if(path, "old\n", "new\n", keep=kept)
    assert path.read_text() == "saved by the learner\n" and not kept.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["alerts.yml"]


def test_a_file_gone_is_not_created(tmp_path):
    assert not replace_if(tmp_path / "alerts.yml", "old\n", "new\n")
    assert list(tmp_path.iterdir()) == []
