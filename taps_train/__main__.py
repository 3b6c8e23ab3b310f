from taps_train.cli import main

main()
