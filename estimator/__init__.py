"""Difficulty estimation: request features, the embedding encoder (ONNX), the
scikit-learn head exported to ONNX, and the onnxruntime ``DifficultyEstimator``
that turns a request into ``p_hard``.

Serving imports only onnxruntime, tokenizers and numpy from here; export and
training helpers import torch / scikit-learn lazily and only when called.
"""
