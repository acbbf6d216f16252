"""Writer subprocess for the crash test: resumes the store at argv[1] and adds documents d0..d{argv[2]-1}.

Prints ``ready <num_done>`` once the writer is open, then writes until done (or until it is killed).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from aheadrank.store import StoreWriter  # noqa: E402
from store_testkit import doc_fields, make_spec  # noqa: E402

CRASH_SPEC = {"shard_size": 6, "compression": "none", "dtype": "float16"}


def main() -> None:
    path, total = Path(sys.argv[1]), int(sys.argv[2])
    with StoreWriter(path, make_spec(**CRASH_SPEC), resume=True) as writer:
        print(f"ready {writer.num_done}", flush=True)
        for i in range(writer.num_done, total):
            writer.add(f"d{i}", doc_fields(i))
    print("done", flush=True)


if __name__ == "__main__":
    main()
