"""gpudoctor's start-up hook, run by every Python interpreter of a profiled job (its folder is first on PYTHONPATH).

It takes its folder off sys.path, runs the environment's own sitecustomize if there is one, and lets
gpudoctor.collect.follow decide whether this process is a rank of the job to record. It never raises: a
process gpudoctor cannot follow runs as it would without it.
"""

import os
import sys


def _gpudoctor_start() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    ours = sys.modules.pop("sitecustomize")
    try:
        import sitecustomize  # noqa: F401 - the environment's own, which this one stood in front of
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
        sys.modules["sitecustomize"] = ours  # the import that runs this module takes it from there when done
    if not os.environ.get("GPUDOCTOR_FOLLOW"):
        return
    # gpudoctor's own folder, for its import only: the program's sys.path stays as python makes it.
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    added = root not in sys.path
    if added:
        sys.path.append(root)
    try:
        from gpudoctor.collect import follow

        follow.at_interpreter_start()
    except Exception as exc:  # noqa: BLE001 - the job runs on, unrecorded, rather than fail in its start-up
        print(f"gpudoctor: process {os.getpid()} is not recorded: {exc}", file=sys.stderr)
    finally:
        if added and root in sys.path:
            sys.path.remove(root)


_gpudoctor_start()
