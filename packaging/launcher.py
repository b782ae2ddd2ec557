"""Entry script of the PyInstaller bundle (packaging/tandem.spec): the `tandem` command, app.main.main.

A script, not a package module: packaging/ never holds an __init__.py (it would shadow PyPI's `packaging`).
"""

import sys

from app.main import main

if __name__ == "__main__":
    sys.exit(main())
