"""macaron-ray: serving for Mixture-of-LoRA models on Ray Serve and vLLM."""

__version__ = "0.1.0"
