"""The MoL application on Ray Serve: `serve deploy` files point at `macaron_ray.serve:build_app`."""

from macaron_ray.serve.app import build_app

__all__ = ["build_app"]
