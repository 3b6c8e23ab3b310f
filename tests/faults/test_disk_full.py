"""A disk that fills during a write (issue 36): one line naming the file, the space it needs and what is free, exit
non-zero, nothing half-written left for a later run to take, and a rerun with space writes what an undisturbed run
writes. The disk is real: a tmpfs of a chosen size."""

import hashlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from taps_train import files
from taps_train.cli import main
from tests.export.test_export import fingerprint, make_drafter, save_checkpoint, verifier  # noqa: F401 (fixtures)

pytestmark = pytest.mark.faults


def tree_digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*")) if p.is_file()}


def test_a_library_that_hides_a_full_disk_still_ends_in_one_line(small_disk):
    disk = small_disk(100_000)
    target = disk / "state.pt"
    target.write_bytes(b"the previous state")
    with pytest.raises(files.DiskFull) as err:
        with files.atomic_file(target) as tmp:
            torch.save({"weights": torch.zeros(100_000)}, tmp)  # torch says "unexpected pos", not "no space"
    message = str(err.value)
    assert "\n" not in message and f"no space left for {target}" in message and "kB free" in message
    assert [p.name for p in disk.iterdir()] == ["state.pt"] and target.read_bytes() == b"the previous state"


def test_a_writer_that_knows_its_size_says_it(small_disk):
    disk = small_disk(50_000)
    with pytest.raises(files.DiskFull, match=r"needs 300 kB and its device has 5\d(\.\d)? kB free"):
        files.write_text(disk / "report.md", "x" * 300_000)
    assert list(disk.iterdir()) == []


def test_a_directory_that_fills_keeps_the_old_one(small_disk):
    disk = small_disk(200_000)
    target = disk / "export"
    with files.atomic_directory(target) as staging:
        (staging / "config.json").write_text("{}")
    with pytest.raises(files.DiskFull, match=f"no space left for {target}"):
        with files.atomic_directory(target) as staging:
            save_file({"w": torch.zeros(100_000)}, staging / "model.safetensors")
    assert sorted(p.name for p in disk.iterdir()) == ["export"] and [p.name for p in target.iterdir()] == ["config.json"]


@pytest.mark.parametrize("command", ["export", "average"])
def test_a_command_writing_to_a_full_disk_is_one_line_and_its_rerun_is_identical(command, verifier, fingerprint, small_disk, tmp_path,  # noqa: F811
                                                                                  capsys):
    checkpoints = [save_checkpoint(make_drafter(verifier, seed, fc_bias=False), fingerprint, tmp_path / f"d{seed}.ckpt") for seed in (1, 2)]

    def run(out: Path) -> list[str]:
        if command == "export":
            return ["export", str(checkpoints[0]), "--out", str(out), "--no-embeddings", "--dtype", "float32"]
        return ["average", "--drafters", *map(str, checkpoints), "--output", str(out)]

    main(run(tmp_path / "undisturbed"))
    reference = tree_digest(tmp_path / "undisturbed") if command == "export" else hashlib.sha256((tmp_path / "undisturbed").read_bytes()).hexdigest()
    capsys.readouterr()
    full = small_disk(20_000) / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(run(full))
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 1 and len(err.splitlines()) == 1 and f"no space left for {full}" in err, err
    assert list(full.parent.iterdir()) == []  # nothing a later run could take for done
    roomy = small_disk(50_000_000) / "out"
    main(run(roomy))
    assert (tree_digest(roomy) if command == "export" else hashlib.sha256(roomy.read_bytes()).hexdigest()) == reference
