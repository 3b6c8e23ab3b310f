"""`taps-train average`: drafters averaged in weight space."""


def run(args: list[str]) -> None:
    import argparse

    from taps_train.drafter.average import write_average

    parser = argparse.ArgumentParser(prog="taps-train average", description="θ = Σ λ_i θ_i over drafters trained against the same verifier.")
    parser.add_argument("--drafters", nargs="+", required=True, help="two or more drafter checkpoints")
    parser.add_argument("--weights", nargs="+", type=float, default=None, help="λ per drafter (non-negative, sum 1; default uniform)")
    parser.add_argument("--output", required=True, help="where to write the averaged checkpoint")
    options = parser.parse_args(args)
    print(write_average(options.drafters, options.weights, options.output))
