"""`python -m monet_opt`: the `monet-opt` command (monet_opt/cli.py)."""
import sys

from monet_opt.cli import main

sys.exit(main())
