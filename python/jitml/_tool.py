"""The `jitml` console command of the pip-installed package: runs the command-line tool
(tools/jitml.c) that the wheel carries in jitml/bin/, with the same arguments."""

import os
import sys


def tool_path():
    """The bundled tool's path, or None (a checkout's python/jitml carries none)."""
    p = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "jitml")
    return p if os.access(p, os.X_OK) else None


def main():
    p = tool_path()
    if p is None:
        sys.stderr.write("jitml: the command-line tool is not part of this copy of the "
                         "package (a source checkout's python/; run build/tools/jitml, or "
                         "install the package with pip)\n")
        return 2
    os.execv(p, [p] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
