"""`taps-train consolidate`: one drafter checkpoint file from a DeepSpeed checkpoint directory."""


def run(args: list[str]) -> None:
    import argparse

    from taps_train.drafter.deepspeed_checkpoint import consolidate

    parser = argparse.ArgumentParser(
        prog="taps-train consolidate",
        description="Merge the ZeRO partitions of a DeepSpeed checkpoint directory (ZeRO-2 or 3) into one file holding the "
        "trained drafter weights (float32), its config and verifier fingerprint. eval/export/average/init_from also read the directory itself.",
    )
    parser.add_argument("checkpoint", help="a `<name>.ckpt` directory written by `taps-train fit` under DeepSpeed")
    parser.add_argument("--output", default=None, help="output file (default: <name>.drafter.ckpt next to the directory)")
    options = parser.parse_args(args)
    print(consolidate(options.checkpoint, options.output))
