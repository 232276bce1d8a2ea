"""The MoL core: engine-agnostic, no Ray."""
