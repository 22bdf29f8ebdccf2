# Written by `oomdbg record` into a private directory put first on PYTHONPATH. It runs the sitecustomize
# module this one hides, if the job has one, and then arms oomdbg's recorder, which starts when the job
# imports torch. Nothing here may stop the job: every failure of the recorder is reported once and ignored.
import os
import sys


def _run_hidden_sitecustomize():
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _run_hidden_sitecustomize()
finally:
    try:
        import oomdbg_record

        oomdbg_record.install()
    except Exception as e:  # the job runs as if oomdbg were not there
        sys.stderr.write("oomdbg record: the recorder did not start (%s: %s)\n" % (type(e).__name__, e))
