"""growtool: offline width growth of transformer checkpoints.

The library (docs/library.md)::

    import growtool
    ck = growtool.load("model.safetensors")
    grown = growtool.expand("model.safetensors", width=1024, out="grown.safetensors")
    report = growtool.verify("model.safetensors", grown)   # report.passed, report.rows ...
    plain = growtool.fold(grown, alpha=1.0, out="plain.safetensors")

Each name is imported on first use, so ``import growtool`` itself imports no torch."""

__version__ = "0.1.0"

# public name -> (module, attribute); modules are named apart from the functions (``check``
# holds ``verify``) so that importing a submodule never replaces a function on the package
_API = {
    "load": ("growtool.io.checkpoint", "load"),
    "expand": ("growtool.surgery", "expand"),
    "fold": ("growtool.surgery", "fold"),
    "verify": ("growtool.check", "verify"),
    "inspect": ("growtool.info", "inspect"),
    "train": ("growtool.training.loop", "train"),
}

__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'growtool' has no attribute {name!r}")
    import importlib

    module, attr = _API[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_API))
