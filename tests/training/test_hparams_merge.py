"""A fit whose data builds its cache in another precision than the module runs the verifier in: both are legitimate
settings, and Lightning's logger refuses two values under one hyperparameter name unless they are kept apart."""

from lightning.pytorch import Trainer
from lightning.pytorch.loggers import CSVLogger

from taps_train.data.datamodule import DrafterDataModule
from taps_train.training import Eagle2Module
from tests.eval.test_eval import recipe  # noqa: F401 (fixture)


def test_data_and_module_verifier_dtypes_may_differ_with_a_logger(recipe, random_verifier_dir, tmp_path):  # noqa: F811
    data = DrafterDataModule(recipe, verifier=str(random_verifier_dir), batch_size=4, verifier_dtype="float32")
    module = Eagle2Module(verifier=str(random_verifier_dir), verifier_dtype="auto")
    trainer = Trainer(accelerator="cpu", max_steps=1, logger=CSVLogger(tmp_path), enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, limit_val_batches=0, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=data)
    logged = (tmp_path / "lightning_logs" / "version_0" / "hparams.yaml").read_text()
    assert "cache_verifier_dtype: float32" in logged and "verifier_dtype: auto" in logged
