"""The trace: one training iteration, layer by layer (DESIGN.md section 1)."""

from snsim.trace.io import from_dict, load, save, schema, to_dict
from snsim.trace.model import DEFAULT_DEVICE, KINDS, SCHEMA, Device, Layer, Trace, Workspace

__all__ = ["load", "save", "from_dict", "to_dict", "schema", "Trace", "Layer", "Device",
           "Workspace", "KINDS", "SCHEMA", "DEFAULT_DEVICE"]
