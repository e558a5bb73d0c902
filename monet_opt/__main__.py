"""`python -m monet_opt`: the `monet-opt` command (monet_opt/cli.py)."""
import sys

from monet_opt.cli import main

if __name__ == "__main__":  # imported (a walk over the package's modules), it runs nothing
    sys.exit(main())
