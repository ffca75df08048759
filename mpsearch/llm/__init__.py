"""Decoder language models: weight-only block formats, quantization, text data and metrics."""
