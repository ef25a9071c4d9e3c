"""Quantization entry points: calibrate, quantize_static, patch_onnxruntime, model-level selection."""
