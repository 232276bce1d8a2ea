"""The frozen base model: fetched from a wheel, converted once, cached."""
