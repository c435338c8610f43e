"""`shardrun -n N program ...`: the launcher that ships with the package (a C++ binary)."""

import os
import sys


def main() -> None:
    binary = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "shardrun")
    os.execv(binary, [binary] + sys.argv[1:])
