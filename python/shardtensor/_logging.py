"""shardtensor's C++ log through Python's logging, under the ``shardtensor`` logger.

    TORCH_LOGS=+shardtensor python train.py      # debug: every propagation miss and redistribute plan
    torch._logging.set_logs(modules={"shardtensor": logging.DEBUG})   # the same, from the program
    SHARDTENSOR_LOG=1 python train.py            # info: one line per operator call

torch reads TORCH_LOGS for any importable module name, as it does ``+dtensor`` for DTensor:
``+shardtensor`` is DEBUG, ``shardtensor`` INFO, ``-shardtensor`` ERROR. The C++ side asks the
logger whether it wants debug lines on each propagation or plan miss (never on a cached call),
so a level set at any time takes effect at the next miss. Per-call lines exist only under
SHARDTENSOR_LOG (the dispatcher's fast path skips them otherwise); with it set and no level
configured, the logger shows INFO on stderr.
"""

from __future__ import annotations

import logging
import os

from . import _C

logger = logging.getLogger("shardtensor")


def _write(level: int, line: str) -> None:
    logger.log(level, line)


def install() -> None:
    _C.set_log_sink(_write, logger.isEnabledFor)
    if os.environ.get("SHARDTENSOR_LOG", "0") not in ("", "0") and not logger.isEnabledFor(logging.INFO):
        logger.setLevel(logging.DEBUG if os.environ["SHARDTENSOR_LOG"] == "debug" else logging.INFO)
        if not logger.handlers:
            logger.addHandler(logging.StreamHandler())


def uninstall() -> None:
    """Back to stderr (at exit: the sink needs the interpreter)."""
    _C.set_log_sink(None, None)
