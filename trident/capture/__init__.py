from .host_driver import HostOnlyDriver, ensure_triton_driver
from .trace import capture

__all__ = ["HostOnlyDriver", "capture", "ensure_triton_driver"]
