"""The `torch_dynamo_backends` entry point of the trident-scm distribution.

`torch.compile(fn, backend="trident")` without `import trident` finds the backend here: torch's
registry loads this module when the backend is looked up, before Dynamo traces. Importing
trident here sets up what tracing needs (the host-only Triton driver on a machine without a
GPU). `trident`'s own import registers the backend by name too, which torch's registry would
refuse as a duplicate once it registers what this entry point gives, so that registration is
skipped while this module loads (`LOADING`).
"""

LOADING = True
try:
    import trident as _trident  # noqa: F401
finally:
    LOADING = False

from trident.frontends.dynamo import trident_backend as backend  # noqa: E402

__all__ = ["backend"]
