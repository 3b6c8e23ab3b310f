"""Shipped configs and recipes (taps_train/shipped.py): found from any directory, listed and copied with what they
name; and, installed from a wheel (marker `integration`), usable with no clone at all."""

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from taps_train.cli import main
from taps_train.data.recipe import load_recipe
from taps_train.errors import TapsError
from taps_train.shipped import PACKAGE, copy_config, shipped_configs, shipped_path

REPO = Path(__file__).resolve().parents[2]


def test_a_users_file_wins_and_shipped_files_are_found_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert shipped_path("data_recipes/tiny_math.yaml") == PACKAGE / "data_recipes/tiny_math.yaml"
    assert load_recipe("data_recipes/tiny_math.yaml").name == "tiny_math"
    (tmp_path / "data_recipes").mkdir()
    (tmp_path / "data_recipes/tiny_math.yaml").write_text("name: mine\n")
    assert shipped_path("data_recipes/tiny_math.yaml") == Path("data_recipes/tiny_math.yaml")
    assert shipped_path("data_recipes/none.yaml") == Path("data_recipes/none.yaml")
    assert shipped_path("elsewhere/tiny_math.yaml") == Path("elsewhere/tiny_math.yaml")  # only the shipped folders


def test_the_repository_links_the_shipped_folders():
    for name in ("configs", "data_recipes"):
        assert (REPO / name).resolve() == PACKAGE / name


def test_ls_lists_every_shipped_config(capsys):
    main(["configs", "ls"])
    listed = capsys.readouterr().out.split()
    assert listed == shipped_configs() and "smol/eagle2_math.yaml" in listed and "study/smol_taps.yaml" in listed


def test_cp_copies_a_study_with_every_config_and_recipe_it_names(tmp_path, capsys):
    main(["configs", "cp", "study/smol_taps.yaml", str(tmp_path)])
    written = capsys.readouterr().out
    assert "configs/study/smol_taps.yaml" in written
    copied = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.yaml")}
    assert {"configs/smol/eagle2_mixed.yaml", "data_recipes/smol_math.yaml", "data_recipes/smol_chat.yaml"} <= copied
    for path in copied:
        assert (tmp_path / path).read_bytes() == (PACKAGE / path).read_bytes()
    os.chdir(tmp_path)
    try:
        assert shipped_path("data_recipes/smol_math.yaml") == Path("data_recipes/smol_math.yaml")  # the copy is read
    finally:
        os.chdir(REPO)


def test_cp_refuses_unknown_configs_and_never_overwrites_a_changed_file(tmp_path):
    with pytest.raises(TapsError, match="no shipped config 'smol/none.yaml'; `taps-train configs ls` lists them"):
        copy_config("smol/none.yaml", tmp_path)
    copy_config("smol/eagle2_math.yaml", tmp_path)
    copy_config("configs/smol/eagle2_math.yaml", tmp_path)  # the same files again: nothing changes
    (tmp_path / "data_recipes/smol_math_4k.yaml").write_text("name: edited\n")
    with pytest.raises(TapsError, match="smol_math_4k.yaml already exist with other content"):
        copy_config("smol/eagle2_math.yaml", tmp_path)
    assert (tmp_path / "data_recipes/smol_math_4k.yaml").read_text() == "name: edited\n"


@pytest.mark.integration
def test_an_installed_wheel_runs_its_shipped_configs_and_benchmarks_from_an_empty_directory(tmp_path):
    """Built and installed as a user would (no clone on the path): the wheel holds the configs and recipes."""
    source = tmp_path / "source"  # a copy, so that the build leaves nothing in the repository (setuptools builds in-tree)
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source)
    shutil.copytree(REPO / "taps_train", source / "taps_train", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"), str(source)],
                   check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("taps_train-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    python = tmp_path / "venv/bin/python"
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(site.getsitepackages())}  # torch & co. from this venv, not taps_train

    def run(*code: str) -> str:
        done = subprocess.run([python, "-c", "\n".join(code)], cwd=empty, env=environment, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    where = run("import taps_train; print(taps_train.__file__)")
    assert where.startswith(str(tmp_path / "venv")), where
    run("from taps_train.cli import main", "main(['configs', 'cp', 'smol/eagle2_math.yaml'])")
    assert (empty / "configs/smol/eagle2_math.yaml").is_file() and (empty / "data_recipes/smol_math_4k.yaml").is_file()
    out = run("from taps_train.eval.benchmarks import load_benchmark",
              "from taps_train.data.recipe import load_recipe",
              "print(len(load_benchmark('math_heldout', 3)[0]), load_recipe('data_recipes/tiny_chat.yaml').name)")
    assert out.split() == ["3", "tiny_chat"]
