"""DDP on CPU: two gloo processes launched by `taps-train fit`, each training on its own half of the batches."""

import os
import subprocess
import sys

import torch
import yaml


def test_fit_with_ddp_on_two_cpu_processes(tmp_path, random_verifier_dir):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: ddp\nseed: 0\nmax_length: 256\nsources:\n  - source: gsm_symbolic\n    args: {size: 60, seed: 5}\n    heldout: 4\n    count: 32\n")
    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu", "devices": 2, "strategy": "ddp", "max_steps": 3, "logger": False,
            "enable_progress_bar": False, "limit_val_batches": 1, "val_check_interval": 3, "num_sanity_val_steps": 0,
            "default_root_dir": str(tmp_path / "run"),
            "callbacks": [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                           "init_args": {"dirpath": str(tmp_path / "run"), "save_last": True}}],
        },
        "model": {"class_path": "taps_train.training.HassModule", "init_args": {"verifier": str(random_verifier_dir), "lr": 1e-3}},
        "data": {"class_path": "taps_train.data.datamodule.DrafterDataModule", "init_args": {"recipe": str(recipe), "batch_size": 4}},
    }
    path = tmp_path / "ddp.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "TAPS_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    result = subprocess.run([sys.executable, "-m", "taps_train", "fit", "--config", str(path)],
                            capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in result.stderr
    checkpoint = torch.load(tmp_path / "run" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 3
    # 32 samples in batches of 4 = 8 batches, split over 2 ranks: 4 per epoch each.
    assert checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["completed"] == 3
