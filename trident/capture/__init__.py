from .host_driver import HostOnlyDriver, ensure_triton_driver
from .trace import capture, data_dependent

__all__ = ["HostOnlyDriver", "capture", "data_dependent", "ensure_triton_driver"]
