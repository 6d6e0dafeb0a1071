"""An import stand-in for `hyper_parallel`, for the MindFormers recipe test only (tests/e2e/test_mindformers_recipe.py).

MindFormers 2.0.0 requires hyper-parallel, which the package index here does not have. Its PyNative trainer
modules import names from it at module level, so `import mindformers` fails without it, although the Graph-mode
`Trainer` path that docs/mindformers.md uses never calls into it. This package lets those imports succeed:
every public name, in it or in any submodule, is an inert placeholder class (it can be subclassed, built and
called, and does nothing). The two subpackages that MindFormers imports inside `try/except ImportError` (the distributed checkpoint
layout and the custom NPU kernels) stay missing, so MindFormers takes its own fallbacks there.

A machine whose index has hyper-parallel installs it instead and needs none of this.
"""
import importlib.abc
import importlib.machinery
import sys
import types

# MindFormers guards these imports itself; making them succeed would replace its fallbacks with placeholders.
LEFT_MISSING = ("hyper_parallel.core.distributed_checkpoint", "hyper_parallel.custom_ops")


class _Inert:
    """Accepts any construction, call, attribute or `with`, and does nothing: MindFormers' PyNative modules
    call some of these at import time (`get_platform()`), and the Graph-mode path never uses the results."""

    def __init__(self, *_args, **_kwargs):
        pass

    def __call__(self, *_args, **_kwargs):
        return _Inert()

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        return False


def _placeholder(qualified_name: str) -> type:
    module, _, name = qualified_name.rpartition(".")
    return type(name, (_Inert,), {"__module__": module})


def _module_getattr(module_name: str):
    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{module_name}.{name}")
    return __getattr__


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith(__name__ + ".") or fullname.startswith(LEFT_MISSING):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr(spec.name)
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _StandInFinder())
__getattr__ = _module_getattr(__name__)
__version__ = "0+stand-in"
