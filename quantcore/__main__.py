"""``python -m quantcore`` / the ``quantcore`` console script."""
import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="quantcore",
        description="Framework-free quantization observers and fake quantization.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="train, post-training quantize and QAT a NumPy MLP "
                                       "on scikit-learn's digits (the main job)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument("--plot", default="quantcore_demo.png",
                      help="where to save the training curves (default quantcore_demo.png; "
                           "'' for none)")
    sub.add_parser("info", help="print how the extension was built")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run_demo
        run_demo(seed=args.seed, plot_path=args.plot)
        return 0
    if args.command == "info":
        import quantcore
        for key, value in quantcore.build_info().items():
            print(f"{key:20s} {value}")
        return 0
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
